"""Named resources for common GPU nodes, registered with torchx (``-h gpu.h100.8``).

With a GPU host, ``-j N`` alone runs N nodes of one process per GPU. The CPU
and memory figures leave headroom below what such nodes offer, so the pods and
Slurm jobs fit after the kubelet's and the system's reservations; register
your own (``torchx.named_resources`` entry point) for other shapes.
"""

from torchx.specs import Resource


def gpu_h100_8() -> Resource:
    """A node of 8 H100 80GB (e.g. p5.48xlarge, ND H100 v5, a3-highgpu-8g)."""
    return Resource(cpu=176, gpu=8, memMB=1_800_000)


def gpu_a100_8() -> Resource:
    """A node of 8 A100 (e.g. p4d.24xlarge, ND A100 v4, a2-highgpu-8g)."""
    return Resource(cpu=88, gpu=8, memMB=1_000_000)


def gpu_1() -> Resource:
    """One GPU and a slice of a node: small runs, evaluation, debugging."""
    return Resource(cpu=8, gpu=1, memMB=60_000)
