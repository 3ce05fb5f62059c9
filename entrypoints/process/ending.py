"""How a job's process ends: a check's one ``posttrain:`` line (exit 2), a crash recorded whole (exit 1), a
``sys.exit`` in user code named; and what libraries print that tells a user nothing, silenced first."""

import contextlib
import dataclasses
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Iterator, Optional

import torch
from transformers.utils import logging as transformers_logging

from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.process import distributed
from posttrain.entrypoints.process.error_file import CRASHED, STOPPED, Exit, record_crash, record_error, say


@dataclasses.dataclass
class Ending:
    """Where a crash's traceback is kept: the run's ``logs`` directory, once the spec that names it is read."""

    logs: Optional[Path] = None


@contextlib.contextmanager
def ends_in_one_line() -> Iterator[Ending]:
    """How a job's process ends when something stops it: a SpecError in one ``posttrain:`` line (exit 2), anything
    else recorded whole, its traceback kept in the ending's ``logs`` (exit 1); the process group destroyed either
    way."""
    ending = Ending()
    try:
        yield ending
    except SpecError as error:
        # every rank meets the same error (the checks agree across ranks, see distributed.all_ranks_agree): one says
        # it; an error this rank may have met alone is said by this rank (else the job would end without a word)
        if distributed.env_rank() == 0 or error.this_rank_only:
            say(f"posttrain: {error}")
        # every rank: whichever torchrun names the root cause
        record_error(f"posttrain: {error}")
        raise SystemExit(STOPPED) from None
    except Exit:
        raise
    except SystemExit as exit:
        # sys.exit where posttrain does not bound the call (user_code.py does): a run never ends quietly half-done
        line = f"posttrain: rank {distributed.env_rank()}: {_called_exit(exit)}; the job stops"
        say(line)
        record_error(line)
        raise SystemExit(STOPPED) from None
    except Exception as error:
        # else another rank ended first and says why
        if not distributed.lost_a_peer(error):
            record_crash(error, distributed.env_rank(), ending.logs)
        raise SystemExit(CRASHED) from None
    finally:
        distributed.destroy_process_group()


def _called_exit(exit: SystemExit) -> str:
    """Where a ``sys.exit`` came from, as a line says it: its exit code and the innermost frame that raised it."""
    frames = traceback.extract_tb(exit.__traceback__)
    # sys.exit itself has no Python frame: the last one is its caller's
    where = f" in {frames[-1].name} ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"sys.exit({exit.code!r}) was called{where} while the job ran"


def quiet_libraries() -> None:
    """What libraries print that tells a user nothing: DeepSpeed's warning from every rank that it found no GPU (on
    a CPU job), the progress bars of saving and loading weights in a log (a file or a pipe, not a terminal),
    TRL's use of a name transformers deprecated, and its warning that a feature posttrain uses is experimental."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not sys.stderr.isatty():
        transformers_logging.disable_progress_bar()
    # TRL 1.16 asks transformers 5 for the flag by its old name, from every rank: nothing the user can change
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    # posttrain pins TRL, and its rollout_func (an agent program's rollouts) is experimental there: from every rank
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
