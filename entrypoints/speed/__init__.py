"""The fast paths: padding-free rows and their attention kernels, Liger, the GPU batch and memory estimate."""
