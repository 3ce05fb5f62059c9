"""The program each ``code_tests`` sandbox runs (``code_runs.py`` starts it by path, twice per completion): it bounds
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

Standard library only, and no import it does not need: it starts twice per completion.
"""

import builtins
import ctypes
import importlib
import json
import os
import resource
import sys
import types
from typing import Any, Callable, Dict, List, Set

# the names Linux gives the bounds and its calls (linux/mount.h, linux/prctl.h, linux/capability.h, linux/seccomp.h)
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = -100, 0x8000, 0x1, 442
MS_NOSUID, MS_NODEV = 0x2, 0x4
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 24, 38, 22, 2
CAPABILITY_VERSION_3 = 0x20080522
CLONE_THREAD, X32_SYSCALL = 0x00010000, 0x40000000
EPERM, ENOSYS = 1, 38
# seccomp's architecture and the numbers of the calls that start a process, per machine
PROCESS_CALLS = {
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435}),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435}),
}
# files the scratch directory may hold at most (its bytes are bounded by its size)
SCRATCH_FILES = 4096


class MountAttributes(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]


class CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapabilitySets(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class FilterInstruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class FilterProgram(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(FilterInstruction))]


LIBC = ctypes.CDLL(None, use_errno=True)


def _done(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def make_read_only() -> None:
    """Every mount of this mount namespace read-only (mounts made later, the scratch directory, are not)."""
    # the whole machine's mounts, were this not a namespace of its own: never
    with open("/proc/self/uid_map") as file:
        if file.read().split() == ["0", "0", "4294967295"]:
            raise OSError(EPERM, "read-only: not in a user namespace of its own")
    attributes = MountAttributes(attr_set=MOUNT_ATTR_RDONLY)
    size = ctypes.sizeof(attributes)
    _done(LIBC.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attributes), size), "read-only")


def mount_scratch(scratch: str, size: int) -> None:
    """A tmpfs of ``size`` bytes on ``scratch``: a bound on the disk it fills, gone with the namespace."""
    options = f"size={size},nr_inodes={SCRATCH_FILES},mode=0700".encode()
    _done(LIBC.mount(b"tmpfs", scratch.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options), "scratch tmpfs")


def drop_privileges(bounding_set: bool) -> None:
    """No capability now or after an exec (nor, with ``bounding_set``, ever again in this namespace): what
    ``make_read_only`` did cannot be undone."""
    if bounding_set:
        with open("/proc/sys/kernel/cap_last_cap") as file:
            last = int(file.read())
        for capability in range(last + 1):
            _done(LIBC.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0), "capability bounding set")
    _done(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    sets = (CapabilitySets * 2)()
    _done(LIBC.capset(ctypes.byref(CapabilityHeader(CAPABILITY_VERSION_3, 0)), sets), "capabilities")


def forbid_processes() -> None:
    """A seccomp filter: threads may start, processes may not (a fork bomb makes none)."""
    if os.uname().machine not in PROCESS_CALLS:
        raise OSError(ENOSYS, f"no seccomp filter for {os.uname().machine}")
    architecture, calls = PROCESS_CALLS[os.uname().machine]
    load, equal, at_least, any_bit, give = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, refuse = 0x7FFF0000, 0x00050000
    # (code, jump if true, jump if false, operand); jumps to a label by name, resolved below. Offsets 0, 4 and 16
    # of seccomp_data: the call's number, the architecture, the low half of its first argument (clone's flags)
    code: List[Any] = [
        (load, 0, 0, 4),
        (equal, 0, "refuse", architecture),
        (load, 0, 0, 0),
        (at_least, "refuse", 0, X32_SYSCALL),
        # clone3's flags are out of a filter's reach: "not here" makes the C library fall back to clone
        (equal, "absent", 0, calls["clone3"]),
        *[(equal, "refuse", 0, calls[name]) for name in ("fork", "vfork") if name in calls],
        (equal, 0, "allow", calls["clone"]),
        (load, 0, 0, 16),
        (any_bit, "allow", "refuse", CLONE_THREAD),
        "allow",
        (give, 0, 0, allow),
        "refuse",
        (give, 0, 0, refuse | EPERM),
        "absent",
        (give, 0, 0, refuse | ENOSYS),
    ]
    instructions, labels = [], {}
    for item in code:
        if isinstance(item, str):
            labels[item] = len(instructions)
        else:
            instructions.append(item)
    program = (FilterInstruction * len(instructions))(
        *[
            FilterInstruction(operation, *[labels[j] - at - 1 if isinstance(j, str) else j for j in jumps], operand)
            for at, (operation, *jumps, operand) in enumerate(instructions)
        ]
    )
    filter_program = FilterProgram(len(program), program)
    _done(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(filter_program), 0, 0), "seccomp")


def enter(scratch: str, bounds: Set[str], memory: int, cpu_seconds: int, file_bytes: int) -> None:
    """This process bounded as ``bounds`` (those the probe found) and the limits say, working in ``scratch``."""
    if "read_only" in bounds:
        make_read_only()
    if "scratch" in bounds:
        mount_scratch(scratch, file_bytes)
    os.chdir(scratch)
    drop_privileges(bounding_set="read_only" in bounds)
    if "processes" in bounds:
        forbid_processes()
    for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu_seconds)):
        resource.setrlimit(limit, (value, value))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    # no core dump for a host's crash handler, and no /proc/<pid> of it for another process of this user to open
    _done(LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable")


def probe(scratch: str, bounds: Set[str]) -> List[str]:
    """Which of ``bounds`` this process can set (run once, where the job runs the programs; the mounts only in a
    mount namespace of its own: ``code_runs`` asks for them there alone)."""
    held = []
    for name, step in (("read_only", make_read_only), ("scratch", lambda: mount_scratch(scratch, 2**20))):
        if name not in bounds:
            continue
        try:
            step()
            held.append(name)
        except OSError:
            pass
    try:
        drop_privileges(bounding_set="read_only" in held)
        forbid_processes()
    except OSError:
        return [name for name in held if name != "read_only"]
    try:
        child = os.fork()
    except PermissionError:
        return [*held, "processes"]
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    return held


def encode(value: Any, handle: Callable[[Any], Any]) -> Any:
    """``value`` as JSON, tagged where JSON has no such type; what is not plain data as ``handle`` says."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(item, handle) for item in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(item, handle) for item in value]}
    if kind is dict:
        return {"dict": [[encode(key, handle), encode(item, handle)] for key, item in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    return handle(value)


def decode(data: Any, handle: Callable[[int], Any]) -> Any:
    """What :func:`encode` made, back; a handle's number as ``handle`` says. Anything else is refused."""
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(item, handle) for item in data]
    if kind is dict and len(data) == 1:
        [(tag, content)] = data.items()
        if tag in ("tuple", "set", "frozenset") and type(content) is list:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](decode(item, handle) for item in content)
        if tag == "dict" and type(content) is list and all(type(pair) is list and len(pair) == 2 for pair in content):
            return {decode(key, handle): decode(item, handle) for key, item in content}
        if tag == "bytes" and type(content) is str:
            return bytes.fromhex(content)
        if tag == "complex" and type(content) is list and [type(part) for part in content] == [float, float]:
            return complex(*content)
        if tag == "handle" and type(content) is int:
            return handle(content)
    raise ValueError(f"not plain data: {str(data)[:80]}")


# ---- the program's part


def plain(value: Any) -> Any:
    """A handle's object as plain data, for a comparison: an instance of a subclass of a plain type as that type,
    numpy's arrays and scalars as lists and numbers; anything else cannot be."""
    for kind in (bool, int, float, complex, str, bytes):
        if isinstance(value, kind):
            return kind(value)
    for kind in (list, tuple, set, frozenset):
        if isinstance(value, kind):
            return kind(plain(item) for item in value)
    if isinstance(value, dict):
        return {plain(key): plain(item) for key, item in value.items()}
    for convert in ("tolist", "item"):
        if callable(getattr(value, convert, None)):
            return plain(getattr(value, convert)())
    raise TypeError(f"a {type(value).__name__} is not plain data")


# what the tests may ask of one of the program's objects; "call" sends back the arguments too, as the call left them
OPERATIONS: Dict[str, Callable[..., Any]] = {
    "call": lambda target, args, kwargs: [target(*args, **kwargs), args, kwargs],
    "getattr": getattr,
    "setattr": setattr,
    "getitem": lambda target, key: target[key],
    "setitem": lambda target, key, value: target.__setitem__(key, value),
    "len": len,
    "iter": iter,
    "next": next,
    "bool": bool,
    "str": str,
    "repr": repr,
    "float": float,
    "int": int,
    "index": lambda target: target.__index__(),
    "plain": plain,
}


def play_program(code: str, requests_fd: int, answers_fd: int) -> None:
    """Runs ``code`` as ``__main__``; then, unless it ended the process, answers the tests' requests until they
    close their end."""
    requests = os.fdopen(requests_fd, "r", encoding="utf-8")
    answers = os.fdopen(answers_fd, "w", encoding="utf-8")
    held: List[Any] = []

    def hold(value: Any) -> int:
        held.append(value)
        return len(held) - 1

    def handle(value: Any) -> Any:
        # numpy's arrays and scalars cross as lists and numbers
        if type(value).__module__ == "numpy" and callable(getattr(value, "tolist", None)):
            return encode(value.tolist(), handle)
        return {"handle": hold(value)}

    # a file, so that its traceback shows its lines
    with open("program.py", "w") as file:
        file.write(code)
    main = types.ModuleType("__main__")
    main.__file__ = os.path.abspath("program.py")
    sys.modules["__main__"] = main
    sys.argv = ["program.py"]
    try:
        exec(compile(code, main.__file__, "exec"), vars(main))
    except Exception as error:
        _print_traceback(error)
        sys.exit(1)

    defined = {name: value for name, value in vars(main).items() if not (name.startswith("__") and name.endswith("__"))}
    modules = {name: value.__name__ for name, value in defined.items() if isinstance(value, types.ModuleType)}
    objects = {name: hold(value) for name, value in defined.items() if name not in modules}
    answers.write(json.dumps([objects, modules]) + "\n")
    answers.flush()
    for line in requests:
        # the tests' requests: well formed, they are the harness's own
        operation, target, *arguments = json.loads(line)
        try:
            value = OPERATIONS[operation](held[target], *[decode(argument, held.__getitem__) for argument in arguments])
            reply: Dict[str, Any] = {"value": encode(value, handle)}
        except StopIteration:
            reply = {"stop": True}
        except Exception as error:
            # a call ran the program's code; the rest (a missing attribute, an object not plain) is no news
            if operation == "call":
                _print_traceback(error)
            reply = {"error": [type(error).__name__, str(error)[:500]]}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


def _print_traceback(error: Exception) -> None:
    """The error's traceback on stderr (kept with the sample), from the program's first frame on."""
    trace = error.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename == __file__:
        trace = trace.tb_next
    sys.__excepthook__(type(error), error.with_traceback(trace), trace)


# ---- the tests' part


class ProgramLost(BaseException):
    """The program stopped answering (a BaseException: a test's ``except Exception`` does not hide it)."""


class ProgramError(Exception):
    """An error the program raised that is no built-in exception here."""


class Program:
    """The tests' end of the pipes to the program."""

    def __init__(self, requests_fd: int, answers_fd: int) -> None:
        self.requests = os.fdopen(requests_fd, "w", encoding="utf-8")
        self.answers = os.fdopen(answers_fd, "r", encoding="utf-8")
        # why the program stopped answering, once it has: the verdict is then a failure, whatever the tests caught
        self.lost = ""

    def read(self) -> Any:
        """The program's next line, as JSON."""
        try:
            line = self.answers.readline()
            if line:
                return json.loads(line)
            self.lost = "the program ended before answering"
        except (OSError, ValueError, MemoryError, RecursionError) as error:
            self.lost = f"the program answered what is not a reply: {type(error).__name__}"
        raise ProgramLost(self.lost)

    def ask(self, operation: str, target: int, *arguments: Any) -> Any:
        """What the program says to ``operation`` on its object ``target``, decoded."""
        if self.lost:
            raise ProgramLost(self.lost)
        request = json.dumps([operation, target, *[encode(argument, _handle_number) for argument in arguments]])
        try:
            self.requests.write(request + "\n")
            self.requests.flush()
        except OSError:
            self.lost = "the program ended before answering"
            raise ProgramLost(self.lost) from None
        reply = self.read()
        if type(reply) is dict and len(reply) == 1:
            [(kind, content)] = reply.items()
            if kind == "value":
                try:
                    return decode(content, Handle)
                except (ValueError, TypeError, RecursionError) as error:
                    self.lost = f"the program answered what is not plain data: {error}"
                    raise ProgramLost(self.lost) from None
            if kind == "stop":
                raise StopIteration if operation == "next" else ProgramError("StopIteration")
            if kind == "error" and type(content) is list and [type(part) for part in content] == [str, str]:
                raise _error(*content)
        self.lost = f"the program answered what is not a reply: {str(reply)[:80]}"
        raise ProgramLost(self.lost)


def _error(name: str, message: str) -> Exception:
    """The program's error as the built-in exception of that name, where there is one; iteration's end and the
    exceptions that end a process are not the program's to raise here."""
    kind = getattr(builtins, name, None)
    if (
        isinstance(kind, type)
        and issubclass(kind, Exception)
        and not issubclass(kind, (StopIteration, StopAsyncIteration))
    ):
        try:
            return kind(message)
        except TypeError:
            pass
    return ProgramError(f"{name}: {message}")


PROGRAM: Program


def _handle_number(value: Any) -> Dict[str, int]:
    if isinstance(value, Handle):
        return {"handle": object.__getattribute__(value, "_number")}
    raise TypeError(f"a {type(value).__name__} cannot go to the program: only plain data and its own objects can")


NOT_PLAIN = object()


class Handle:
    """One of the program's objects, held by the tests. What they do with it (call it, read an attribute, index or
    iterate it), the program does, answering with plain data or another handle; what they compare it with (``==``,
    ``<``, ``in``), they compare here, with the plain data the program makes of it: a handle the program cannot make
    plain data of equals nothing."""

    __slots__ = ("_number",)

    def __init__(self, number: int) -> None:
        object.__setattr__(self, "_number", number)

    def _ask(self, operation: str, *arguments: Any) -> Any:
        return PROGRAM.ask(operation, object.__getattribute__(self, "_number"), *arguments)

    def _typed(self, operation: str, kind: type) -> Any:
        value = self._ask(operation)
        if type(value) is not kind:
            raise TypeError(f"the program's {operation} gave a {type(value).__name__}, not a {kind.__name__}")
        return value

    def _plain(self) -> Any:
        try:
            return self._ask("plain")
        except Exception:
            return NOT_PLAIN

    def _comparable(self) -> Any:
        value = self._plain()
        if value is NOT_PLAIN:
            raise TypeError("the program's object is not plain data, so it cannot be ordered or searched")
        return value

    def __getattr__(self, name: str) -> Any:
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._ask("setattr", name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result, args_after, kwargs_after = self._ask("call", list(args), kwargs)
        # what the call did to a list, dict or set it was given (an in-place sort), done to the tests' own
        for given, after in zip([*args, *kwargs.values()], [*args_after, *kwargs_after.values()]):
            if type(given) is list and type(after) is list:
                given[:] = after
            elif type(given) in (dict, set) and type(after) is type(given):
                given.clear()
                given.update(after)
        return result

    def __getitem__(self, key: Any) -> Any:
        return self._ask("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._ask("setitem", key, value)

    def __iter__(self) -> Any:
        iterator = self._ask("iter")
        return iterator if isinstance(iterator, Handle) else iter(iterator)

    def __next__(self) -> Any:
        return self._ask("next")

    def __len__(self) -> int:
        return self._typed("len", int)

    def __bool__(self) -> bool:
        return self._typed("bool", bool)

    def __str__(self) -> str:
        return self._typed("str", str)

    def __repr__(self) -> str:
        return self._typed("repr", str)

    def __float__(self) -> float:
        return self._typed("float", float)

    def __int__(self) -> int:
        return self._typed("int", int)

    def __index__(self) -> int:
        return self._typed("index", int)

    def __eq__(self, other: Any) -> bool:
        value = self._plain()
        return value is not NOT_PLAIN and value == other

    def __ne__(self, other: Any) -> bool:
        return not self == other

    def __lt__(self, other: Any) -> bool:
        return self._comparable() < other

    def __le__(self, other: Any) -> bool:
        return self._comparable() <= other

    def __gt__(self, other: Any) -> bool:
        return self._comparable() > other

    def __ge__(self, other: Any) -> bool:
        return self._comparable() >= other

    def __contains__(self, item: Any) -> bool:
        return item in self._comparable()


def play_tests(tests: str, requests_fd: int, answers_fd: int) -> Dict[str, Any]:
    """Runs ``tests`` against the program; the verdict: whether they passed, and where they failed."""
    global PROGRAM
    try:
        compiled = compile(tests, "tests", "exec")
    except (SyntaxError, ValueError) as error:
        return {"passed": False, "failure": f"the tests do not compile: {error}"}
    PROGRAM = Program(requests_fd, answers_fd)
    try:
        names = PROGRAM.read()
    except ProgramLost:
        return {"passed": False, "failure": "the program ended before its tests ran"}
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["tests"]
    if not (type(names) is list and len(names) == 2 and all(type(part) is dict for part in names)):
        return {"passed": False, "failure": "the program did not name what it defined"}
    objects, modules = names
    # the tests' builtins and their module's own names (``__name__``) stay theirs: a program's ``all`` does not judge
    kept = {name for name in objects.keys() | modules.keys() if hasattr(builtins, name) or name.startswith("__")}
    for name, target in objects.items():
        if type(target) is int and name not in kept:
            setattr(main, name, Handle(target))
    for name, module in modules.items():
        if type(module) is str and name not in kept:
            try:
                setattr(main, name, importlib.import_module(module))
            except Exception:
                pass
    try:
        exec(compiled, vars(main))
        failure = ""
    except SystemExit as exit:
        # unittest.main() exits with False or True
        status = int(exit.code) if isinstance(exit.code, bool) else exit.code
        failure = "" if status in (None, 0) else f"the tests exited with {status}"
    except BaseException as error:
        failure = _where(error, tests)
    failure = failure or PROGRAM.lost
    return {"passed": not failure, "failure": failure[:500]}


def _where(error: BaseException, tests: str) -> str:
    """The line of the tests an error came from, and the error."""
    line, trace = 0, error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == "tests":
            line = trace.tb_lineno
        trace = trace.tb_next
    source = tests.splitlines()[line - 1].strip() if 0 < line <= len(tests.splitlines()) else ""
    what = type(error).__name__ + (f": {error}" if str(error) else "")
    return f"tests line {line}: {source}: {what}" if line else what


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
