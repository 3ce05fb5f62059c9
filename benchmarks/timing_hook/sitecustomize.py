"""Times TRL's profiled sections in every Python process of a benchmarked run, both sides alike.

The harness puts this directory on ``PYTHONPATH`` and names a file in
``BENCH_PROFILE``. Once a process imports ``trl.extras.profiling`` (never
before: the launchers stay as they are), each section TRL times on the main
process (generation, reward scoring, the loss, weight syncs) is appended
there as ``{"name", "end", "seconds"}``. Both sides run TRL's trainers, so the
same code times both; posttrain's own code is not touched.
"""

import importlib.abc
import importlib.util
import json
import os
import sys
import time

PROFILE = os.environ.get("BENCH_PROFILE")
SECTIONS = "trl.extras.profiling"


def _patch(module) -> None:
    timed_exit = module.ProfilingContext.__exit__

    def __exit__(self, *exc_info):
        if self.is_main_process and self._start_time is not None:
            seconds = time.perf_counter() - self._start_time
            with open(PROFILE, "a") as file:
                file.write(json.dumps({"name": self.name, "end": time.time(), "seconds": seconds}) + "\n")
        return timed_exit(self, *exc_info)

    module.ProfilingContext.__exit__ = __exit__


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != SECTIONS:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None:
            return None
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if PROFILE:
    sys.meta_path.insert(0, _PatchOnImport())
