"""Run by path, ``python -I -S <this folder> ROLE ...`` (``code_runs.py``): this folder is then ``sys.path[0]``; the
folder above takes its place while the parts are imported, so that they import one another as one package, and
leaves it before any program or test runs (nothing beside the sandbox is theirs to import)."""

import json
import os
import sys

sys.path[0] = os.path.dirname(sys.path[0])
from code_sandbox.bounds import enter, probe  # noqa: E402
from code_sandbox.program_part import play_program  # noqa: E402
from code_sandbox.tests_part import play_tests  # noqa: E402

del sys.path[0]


def main() -> None:
    packages, role, scratch, listed, memory, cpu_seconds, file_bytes, *pipe_fds = sys.argv[1:]
    # started without site (-S): the job's packages, without the .pth files' work
    sys.path.extend(packages.split(os.pathsep))
    bounds = set(listed.split(",")) - {""}
    if role == "probe":
        print(json.dumps(probe(scratch, bounds)))
        return
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    enter(scratch, bounds, int(memory), int(cpu_seconds), int(file_bytes))
    given = sys.stdin.buffer.read().decode("utf-8", "replace")
    requests_fd, answers_fd = map(int, pipe_fds)
    if role == "program":
        play_program(given, requests_fd, answers_fd)
        return
    # the verdict's own copy of stdout; what the tests print goes to stderr
    verdict = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    verdict.write(json.dumps(play_tests(given, requests_fd, answers_fd)) + "\n")
    verdict.flush()


if __name__ == "__main__":
    main()
