"""How a training job generates: ``generation`` of the algorithms that sample (GRPO, RLOO), and what ties a job
to its vllm role."""

from typing import Any, Dict, List, Optional

from posttrain.components.spec.sections import Strict

# where a job with vllm_mode: server finds its vllm role's host: the component sets it from the scheduler's host
# variables (components/vllm_role.py), the trainers and the role read it (entrypoints/generation/)
VLLM_HOST_VARIABLE = "POSTTRAIN_VLLM_HOST"
# the job's secret between its trainers and its vllm role (entrypoints/generation/vllm_token.py): the component
# makes one for the job in the submitting environment, which local_cwd and Slurm jobs inherit; elsewhere a file the
# job can read
VLLM_TOKEN_VARIABLE = "POSTTRAIN_VLLM_TOKEN"
VLLM_TOKEN_PATH_VARIABLE = "POSTTRAIN_VLLM_TOKEN_PATH"


def runs_vllm_server(training: Dict[str, Any]) -> bool:
    """Whether ``training`` asks for a vLLM server the job runs: server mode, and no server of its own."""
    return (
        bool(training.get("use_vllm"))
        and training.get("vllm_mode", "colocate") == "server"
        and not training.get("vllm_server_base_url")
        and "vllm_server_host" not in training
    )


class TrainingGeneration(Strict):
    """How the trainers and the ``vllm`` role take turns: lockstep (``max_lag: 0``, TRL's own: the trainers push
    their weights, then wait for the samples), or the role generating the next batches while the trainers train,
    its samples at most ``max_lag`` policy versions (optimizer steps) old (entrypoints/generation/run_ahead.py);
    without vLLM, what decodes the rollouts."""

    max_lag: int = 0
    # with max_lag above 0: optimizer steps between two pushes of the weights to the role
    weight_sync_steps: int = 1
    # how long one push of the weights may take before the job ends, in one line
    weight_sync_timeout_s: float = 600.0
    # how long vLLM's generation of one step's samples may take before the job ends, in one line (None: 9/10 of
    # distributed.timeout_s, which the other processes wait for the samples)
    generate_timeout_s: Optional[float] = None
    # without vLLM: rollouts decoded by posttrain's rollout generator, where finished rows leave the batch
    # (entrypoints/speed/rollout_generator.py); false: transformers' generate
    rollout_generator: bool = True

    @property
    def runs_ahead(self) -> bool:
        return self.max_lag > 0

    def generate_timeout(self, collective_timeout_s: float) -> float:
        """``generate_timeout_s``, or where unset 9/10 of the collectives' timeout: the other processes' wait for the
        samples ends there, and the job's line should be the generation's."""
        return self.generate_timeout_s if self.generate_timeout_s is not None else 0.9 * collective_timeout_s

    def problems(self) -> List[str]:
        found = []
        if self.generate_timeout_s is not None and self.generate_timeout_s <= 0:
            found.append(
                f"generation.generate_timeout_s: expected seconds above 0 (unset: 9/10 of distributed.timeout_s); "
                f"got {self.generate_timeout_s:g}"
            )
        if self.max_lag < 0:
            found.append(f"generation.max_lag: expected 0 (lockstep) or more; got {self.max_lag}")
        if self.weight_sync_timeout_s <= 0:
            found.append(
                f"generation.weight_sync_timeout_s: expected seconds above 0; got {self.weight_sync_timeout_s:g}"
            )
        if self.weight_sync_steps < 1:
            found.append(f"generation.weight_sync_steps: expected 1 or more; got {self.weight_sync_steps}")
        elif self.max_lag == 0 and self.weight_sync_steps != 1:
            found.append(
                f"generation.weight_sync_steps: {self.weight_sync_steps} with max_lag: 0 (lockstep), which pushes "
                "the weights before every generation; drop it, or let samples lag (max_lag: "
                f"{self.weight_sync_steps - 1} or more)"
            )
        elif self.max_lag > 0 and self.weight_sync_steps > self.max_lag + 1:
            found.append(
                f"generation.weight_sync_steps: {self.weight_sync_steps} steps between pushes would leave samples "
                f"older than max_lag: {self.max_lag} allows; use at most {self.max_lag + 1}, or raise max_lag"
            )
        return found
