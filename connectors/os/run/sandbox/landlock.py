"""Landlock through ctypes: restrict the calling process to a filesystem, TCP and scope policy.

Used in the forked, single-threaded target right before ``execve``: the domain is
inherited across exec and can never be lifted. One ruleset handles every access
right the running ABI knows, so whatever is not granted here is denied::

    from sensorium.connectors.os.run.sandbox import landlock

    if landlock.abi_version() >= 1:  # in the child, never in the connector itself
        result = landlock.restrict_self(
            read=["/usr", "/lib"], full=["/tmp/scratch"], tcp_connect_ports=None
        )
        assert result.abi >= 1

Layouts and constants follow ``include/uapi/linux/landlock.h``. The syscall numbers
444–446 are the same on x86_64, aarch64 and every other architecture since the
numbers were unified at 424 (alpha, which adds 110, is not a platform we run on).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from sensorium.shared.prctl import PR_SET_NO_NEW_PRIVS, prctl

__all__ = [
    "ACCESS_FS_EXECUTE",
    "ACCESS_FS_IOCTL_DEV",
    "ACCESS_FS_MAKE_BLOCK",
    "ACCESS_FS_MAKE_CHAR",
    "ACCESS_FS_MAKE_DIR",
    "ACCESS_FS_MAKE_FIFO",
    "ACCESS_FS_MAKE_REG",
    "ACCESS_FS_MAKE_SOCK",
    "ACCESS_FS_MAKE_SYM",
    "ACCESS_FS_READ_DIR",
    "ACCESS_FS_READ_FILE",
    "ACCESS_FS_REFER",
    "ACCESS_FS_REMOVE_DIR",
    "ACCESS_FS_REMOVE_FILE",
    "ACCESS_FS_TRUNCATE",
    "ACCESS_FS_WRITE_FILE",
    "ACCESS_NET_BIND_TCP",
    "ACCESS_NET_CONNECT_TCP",
    "FILE_RIGHTS",
    "KNOWN_ABI",
    "READ_RIGHTS",
    "SCOPE_ABSTRACT_UNIX_SOCKET",
    "SCOPE_SIGNAL",
    "LandlockResult",
    "abi_version",
    "handled_fs",
    "handled_net",
    "handled_scopes",
    "restrict_self",
    "ruleset_size",
]

_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446

_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2

# ABI 1
ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
# ABI 2, 3, 5
ACCESS_FS_REFER = 1 << 13
ACCESS_FS_TRUNCATE = 1 << 14
ACCESS_FS_IOCTL_DEV = 1 << 15
# ABI 4
ACCESS_NET_BIND_TCP = 1 << 0
ACCESS_NET_CONNECT_TCP = 1 << 1
# ABI 6
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

# The newest ABI whose rights this module knows. A newer kernel still works: its
# extra rights are simply not handled (reported by the caller from `result.abi`).
KNOWN_ABI = 7

_FS_ABI1 = (1 << 13) - 1
_FS_BY_ABI = (
    0,
    _FS_ABI1,
    _FS_ABI1 | ACCESS_FS_REFER,
    _FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE,
    _FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE,
    _FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV,
)

# The kernel refuses (EINVAL) any other right on a rule whose object is not a directory.
FILE_RIGHTS = (
    ACCESS_FS_EXECUTE
    | ACCESS_FS_WRITE_FILE
    | ACCESS_FS_READ_FILE
    | ACCESS_FS_TRUNCATE
    | ACCESS_FS_IOCTL_DEV
)
READ_RIGHTS = ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR | ACCESS_FS_EXECUTE


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)): 12 bytes, no tail padding
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPortAttr(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


_libc = ctypes.CDLL(None, use_errno=True)
# `syscall` is variadic: one function object per call shape, each with its own argtypes.
_create_ruleset = _libc["syscall"]
_create_ruleset.argtypes = (ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32)
_create_ruleset.restype = ctypes.c_long
_add_rule = _libc["syscall"]
_add_rule.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32)
_add_rule.restype = ctypes.c_long
_restrict_self = _libc["syscall"]
_restrict_self.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_uint32)
_restrict_self.restype = ctypes.c_long


@dataclass(frozen=True, slots=True)
class LandlockResult:
    """What a `restrict_self` call enforced."""

    abi: int
    handled_fs: int
    # Paths given but absent (no rule was added for them).
    skipped: tuple[str, ...]
    scoped: bool
    net_handled: bool


def _fail(what: str, hint: str = "") -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}{hint}")


def probe() -> tuple[int, str | None]:
    """The running kernel's Landlock ABI, and why it is 0 when it is.

    Never raises: a container's seccomp profile answers EPERM, an old kernel ENOSYS,
    a kernel booted without it EOPNOTSUPP; each only means "not here".
    """
    abi = _create_ruleset(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    if abi >= 0:
        return int(abi), None
    err = ctypes.get_errno()
    name = errno.errorcode.get(err, str(err))
    if err == errno.ENOSYS:
        why = "the kernel has no Landlock (Linux >= 5.13 with CONFIG_SECURITY_LANDLOCK)"
    elif err == errno.EOPNOTSUPP:
        why = "Landlock is built in but not enabled: add 'landlock' to the lsm= boot parameter"
    elif err == errno.EPERM:
        why = (
            "a seccomp filter refuses the Landlock calls (a container's default profile): "
            "run the container with a profile that allows landlock_create_ruleset, "
            "landlock_add_rule and landlock_restrict_self"
        )
    else:
        why = os.strerror(err)
    return 0, f"landlock_create_ruleset: {why} [{name}]"


def abi_version() -> int:
    """The running kernel's Landlock ABI; 0 when it has none or may not be used here."""
    return probe()[0]


def handled_fs(abi: int) -> int:
    """Every filesystem right `abi` knows (rights of ABIs past 5 are those of 5)."""
    return _FS_BY_ABI[max(0, min(abi, len(_FS_BY_ABI) - 1))]


def handled_net(abi: int) -> int:
    """The TCP rights `abi` knows: bind and connect from ABI 4 on."""
    return ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP if abi >= 4 else 0


def handled_scopes(abi: int) -> int:
    """The IPC scopes `abi` knows: abstract unix sockets and signals from ABI 6 on."""
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def ruleset_size(abi: int) -> int:
    """The size of `struct landlock_ruleset_attr` as `abi` defines it."""
    # Older kernels reject a larger struct only if its extra bytes are non-zero, but
    # sizing by ABI keeps the call exactly what that ABI defines.
    if abi < 4:
        return 8
    return 16 if abi < 6 else 24


def _add_path(ruleset_fd: int, path: str, access: int) -> bool:
    """Grant `access` beneath `path`; False when the path does not exist."""
    try:
        # Followed: a symlink's grant is meant for its target.
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"Landlock: cannot open {path!r} to grant access to it: {exc.strerror}; "
            "the action's user must be able to reach every path of its fs profile",
        ) from exc
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= FILE_RIGHTS
        attr = _PathBeneathAttr(allowed_access=access, parent_fd=fd)
        if _add_rule(_SYS_LANDLOCK_ADD_RULE, ruleset_fd, _RULE_PATH_BENEATH, ctypes.byref(attr), 0):
            raise _fail(f"landlock_add_rule({path!r}, {access:#x})")
    finally:
        os.close(fd)
    return True


def _add_port(ruleset_fd: int, port: int) -> None:
    if not 0 <= port <= 65535:
        raise ValueError(f"TCP port {port} is out of range; ports are 0–65535")
    attr = _NetPortAttr(allowed_access=ACCESS_NET_CONNECT_TCP, port=port)
    if _add_rule(_SYS_LANDLOCK_ADD_RULE, ruleset_fd, _RULE_NET_PORT, ctypes.byref(attr), 0):
        raise _fail(f"landlock_add_rule(connect tcp/{port})")


def restrict_self(
    *,
    read: Sequence[str],
    full: Sequence[str],
    tcp_connect_ports: Sequence[int] | None,
    abi: int | None = None,
) -> LandlockResult:
    """Enforce a Landlock domain on the calling process (irrevocable).

    `read` paths get read, list and execute; `full` paths every handled right; a
    path that is not a directory gets only the rights a file can carry. Absent
    paths are skipped and listed in the result. From ABI 4, TCP bind is denied and
    connect is allowed only to `tcp_connect_ports` (None: to none). From ABI 6,
    abstract unix sockets and signals are scoped to the domain. `abi` pretends an
    older kernel (default: the running one). Sets no_new_privs.
    """
    running = abi_version()
    abi = running if abi is None else abi
    if abi <= 0 or running == 0:
        raise OSError(
            errno.ENOSYS,
            "Landlock is not available on this kernel (needs Linux ≥ 5.13 with "
            "CONFIG_SECURITY_LANDLOCK and 'landlock' in the lsm= boot parameter); "
            "actions that require it cannot be confined",
        )
    if abi > running:
        raise ValueError(f"Landlock ABI {abi} requested but the kernel speaks only {running}")

    fs = handled_fs(abi)
    net = handled_net(abi)
    scopes = handled_scopes(abi)
    attr = _RulesetAttr(handled_access_fs=fs, handled_access_net=net, scoped=scopes)
    ruleset_fd = int(
        _create_ruleset(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ruleset_size(abi), 0)
    )
    if ruleset_fd < 0:
        raise _fail(f"landlock_create_ruleset(abi {abi}, fs {fs:#x}, net {net:#x})")
    skipped: list[str] = []
    try:
        for paths, access in ((read, READ_RIGHTS & fs), (full, fs)):
            for path in paths:
                if not _add_path(ruleset_fd, path, access):
                    skipped.append(path)
        if net:
            for port in tcp_connect_ports or ():
                _add_port(ruleset_fd, port)
        # Without it an unprivileged caller is refused (EPERM); setting it twice is harmless.
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        if _restrict_self(_SYS_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0):
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset_fd)
    return LandlockResult(
        abi=abi,
        handled_fs=fs,
        skipped=tuple(skipped),
        scoped=bool(scopes),
        net_handled=bool(net),
    )
