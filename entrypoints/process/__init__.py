"""A job's processes, below everything that runs in them: the process group, the error file torchx reads, the lease
on output_dir. Nothing here knows what a run trains."""
