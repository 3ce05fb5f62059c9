"""Where torchrun and torchx look for why a process failed: torchelastic's error file.

torchrun gives each worker ``TORCHELASTIC_ERROR_FILE``, copies the root
cause's file up to its own (which torchx gives the replica), and torchx
reports that as the app's structured error (``AppStatus``, ``runner.wait()``,
``torchx status``). posttrain leaves its one line there. Standard library
only: the rendezvous port's check, before any launcher, uses it too.
"""

import json
import os
import time
from pathlib import Path


def record_error(message: str) -> None:
    """Leaves ``message`` as this process's failure, where the environment names a file for it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        extra = {"py_callstack": "", "timestamp": str(int(time.time()))}  # no traceback: the line says it all
        Path(path).write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))
