"""The program each ``code_tests`` sandbox runs (``code_runs.py`` starts this folder by path, twice per completion): it bounds
itself, then plays one of two parts.

- ``program``: runs a completion's code as ``__main__`` (read from stdin), then answers calls on a pipe pair.
- ``tests``: runs a row's tests (read from stdin) with every top-level name of the code standing for the code's
  object (:class:`Handle`), a module the code imported re-imported here; it compares what comes back itself, and
  writes its verdict, one JSON line, to its stdout, which the program never holds.
- ``probe``: says which bounds this machine lets it set, one JSON line.

Only plain data crosses the pipes: ``None``, bools, numbers, strings, bytes, and lists, tuples, dicts, sets and
frozensets of them, as JSON lines with a tag for what JSON lacks (:func:`encode`, :func:`decode`); any other object
stays in the program as a numbered handle. Nothing from the program is run here, and the program never sees the
tests: to win, it must answer their calls right.

Standard library only, and no import it does not need: it starts twice per completion. One concern a module:
``bounds`` (what the process may do), ``crossing`` (what crosses the pipes), ``program_part`` and
``tests_part``.
"""
