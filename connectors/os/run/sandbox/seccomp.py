"""Seccomp through libseccomp: the deny-list of known escape calls every action runs under.

Everything is allowed except the calls that reach past the other envelopes
(DESIGN §6): io_uring (it bypasses the syscall filter), ptrace and cross-process
memory, namespaces and the mount family, bpf, keys, perf, module and kexec
loading, TTY input injection, and AF_UNIX sockets where the class has no need.
They fail with EPERM; ``clone3`` fails with ENOSYS because its flags live in
memory a filter cannot read, and ENOSYS makes libc fall back to ``clone``,
whose flags it can::

    from sensorium.connectors.os.run.sandbox import seccomp

    f = seccomp.build_filter(allow_unix_sockets=False)  # before the fork
    # ... in the forked child, right before execve:
    # seccomp.install(f)

The filter keeps libseccomp's default bad-architecture action, KILL: a call
through another syscall table (i386 ``int 0x80`` or x32 numbers on x86_64,
aarch32 on aarch64) kills the caller instead of slipping past the native rules.
Argument rules read the registers of x86_64 and aarch64, where ``clone``'s
flags are the first argument.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import os
import socket
from typing import TYPE_CHECKING, Any

from sensorium.shared.prctl import PR_SET_NO_NEW_PRIVS, prctl

if TYPE_CHECKING:
    import pyseccomp

__all__ = [
    "DENIED",
    "DENIED_UNIX_SOCKETS",
    "available",
    "build_filter",
    "denied",
    "install",
    "unsupported",
]

_ALWAYS = (
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "lookup_dcookie",
    "name_to_handle_at",
    "open_by_handle_at",
)

# What the filter denies, for the probe and the module report to publish.
DENIED: tuple[str, ...] = (
    *_ALWAYS,
    "personality(any persona but 0 and the 0xffffffff query)",
    "ioctl(TIOCSTI)",
    "ioctl(TIOCLINUX)",
    "clone(CLONE_NEW*)",
    "clone3",
)
DENIED_UNIX_SOCKETS: tuple[str, ...] = ("socket(AF_UNIX)", "socketpair(AF_UNIX)")
DENIED_BUT_INET: tuple[str, ...] = ("socket(any family but AF_INET, AF_INET6)",)
DENIED_ALL_SOCKETS: tuple[str, ...] = ("socket(any family)", "socketpair(any family)")

_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    # CLONE_NEWTIME: legacy clone reads this bit as part of the exit signal, so the
    # kernel never honours it there; denied anyway so the mask is the whole family.
    0x00000080,
)
_LOW32 = 0xFFFFFFFF

_PR_GET_SECCOMP = 21
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc["prctl"]
_prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_prctl.restype = ctypes.c_int


def _lib() -> Any:
    # Imported late: pyseccomp raises at import when libseccomp is missing, and the
    # probe must still be able to ask `available()`.
    try:
        return importlib.import_module("pyseccomp")
    except (ImportError, RuntimeError, OSError) as exc:
        raise OSError(
            errno.ENOSYS,
            f"libseccomp cannot be loaded ({exc}); install the libseccomp2 package "
            "or run only action classes that do not require seccomp",
        ) from exc


def _deny(f: Any, action: int, name: str, *args: Any) -> bool:
    """Add one rule; False when this architecture has no such call."""
    sc = _lib()
    # Negative: a name libseccomp knows only on other architectures, or not at all.
    if sc.resolve_syscall(sc.Arch.NATIVE, name) < 0:
        return False
    try:
        f.add_rule(action, name, *args)
    except OSError as exc:
        raise OSError(
            exc.errno, f"seccomp: cannot add the rule for {name}: {exc.strerror}"
        ) from exc
    return True


def unsupported() -> tuple[str, ...]:
    """Deny-list names the native architecture does not have (they cannot be called)."""
    sc = _lib()
    names = (*_ALWAYS, "personality", "ioctl", "clone", "clone3", "socket", "socketpair")
    return tuple(n for n in names if sc.resolve_syscall(sc.Arch.NATIVE, n) < 0)


def denied(*, allow_unix_sockets: bool, sockets: str = "any") -> tuple[str, ...]:
    """What `build_filter` with the same arguments denies."""
    more = {"any": (), "inet": DENIED_BUT_INET, "none": DENIED_ALL_SOCKETS}[sockets]
    return (DENIED if allow_unix_sockets else DENIED + DENIED_UNIX_SOCKETS) + more


def build_filter(*, allow_unix_sockets: bool, sockets: str = "any") -> pyseccomp.SyscallFilter:
    """The deny-list as an unloaded libseccomp filter: build it before the fork.

    ``sockets``: "any" family (but AF_UNIX unless allowed), "inet" (AF_INET and
    AF_INET6 only: no AF_VSOCK, AF_NETLINK, AF_PACKET… which a network namespace
    does not isolate or the action has no use for), or "none" (no socket at all: an
    action without a network namespace of its own).
    """
    sc = _lib()
    f = sc.SyscallFilter(sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in _ALWAYS:
        _deny(f, eperm, name)
    # The kernel reads only the low 32 bits of the persona. A 32-bit value other than
    # all-zeros or all-ones has some bit i set whose (cyclic) neighbour i+1 is clear,
    # and a rule per i catches exactly those (one comparison per rule and argument).
    for i in range(32):
        bit, nxt = 1 << i, 1 << ((i + 1) % 32)
        _deny(f, eperm, "personality", sc.Arg(0, sc.MASKED_EQ, bit | nxt, bit))
    for cmd in (_TIOCSTI, _TIOCLINUX):
        # The command is an unsigned int: upper register bits must not dodge the rule.
        _deny(f, eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, _LOW32, cmd))
    for flag in _NAMESPACE_FLAGS:
        _deny(f, eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    _deny(f, sc.ERRNO(errno.ENOSYS), "clone3")
    if not allow_unix_sockets:
        for name in ("socket", "socketpair"):
            _deny(f, eperm, name, sc.Arg(0, sc.MASKED_EQ, _LOW32, socket.AF_UNIX))
    if sockets == "none":
        for name in ("socket", "socketpair"):
            _deny(f, eperm, name)
    elif sockets == "inet":
        # Every family but AF_INET (2) and AF_INET6 (10), on the full register: a value
        # with upper bits set is above 10 and refused, whatever its low 32 bits say.
        for name in ("socket", "socketpair"):
            _deny(f, eperm, name, sc.Arg(0, sc.LT, socket.AF_INET))
            _deny(f, eperm, name, sc.Arg(0, sc.GT, socket.AF_INET6))
            for family in range(socket.AF_INET + 1, socket.AF_INET6):
                _deny(f, eperm, name, sc.Arg(0, sc.EQ, family))
    return f


def install(f: pyseccomp.SyscallFilter) -> None:
    """Load `f` into the calling process (irrevocable); sets no_new_privs first."""
    # An unprivileged caller may load a filter only under no_new_privs.
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    try:
        f.load()
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"seccomp: loading the filter failed: {exc.strerror}; "
            "check that the kernel has CONFIG_SECCOMP_FILTER (seccomp.available())",
        ) from exc


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_BPF_INSN = 8  # struct sock_filter: u16 code, u8 jt, u8 jf, u32 k


def compile_program(f: pyseccomp.SyscallFilter) -> bytes:
    """`f` as the BPF program libseccomp's load would hand the kernel, once: the zygote
    compiles each policy at start, so no sandbox runs libseccomp's code generator."""
    fd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb", closefd=True) as out:
            f.export_bpf(out)
        return os.pread(fd, 1 << 20, 0)
    finally:
        os.close(fd)


def install_program(program: bytes) -> None:
    """Load a program from `compile_program` into the calling process (irrevocable);
    sets no_new_privs first. The same kernel call as libseccomp's load (flags 0)."""
    if not program or len(program) % _BPF_INSN:
        raise OSError(errno.EINVAL, f"seccomp: not a BPF program ({len(program)} bytes)")
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len=len(program) // _BPF_INSN, filter=ctypes.addressof(buf))
    if _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: loading the filter failed: {os.strerror(err)}")


def available() -> bool:
    """Whether the kernel offers seccomp filter mode and libseccomp loads."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            if not any(line.startswith("Seccomp:") for line in status):
                return False
    except OSError:
        return False
    if _prctl(_PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        return False
    # A NULL program is refused with EFAULT only when filter mode exists (EINVAL
    # otherwise); nothing is installed either way.
    if _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, 0, 0, 0) != -1:
        return False
    if ctypes.get_errno() != errno.EFAULT:
        return False
    try:
        _lib()
    except OSError:
        return False
    return True
