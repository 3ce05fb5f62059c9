"""The bounds a sandbox's process sets on itself, through Linux's own calls (``ctypes``): every mount read-only,
a scratch tmpfs, no privilege, no new process (seccomp), and resource limits; and the probe of which this machine
allows."""

import ctypes
import os
import resource
from typing import Any, List, Set

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
