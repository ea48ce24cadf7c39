"""Namespaces and mounts through ctypes: unshare, mount, umount2, user-namespace maps.

Python 3.11 has no ``os.unshare``; and mount(2) has no wrapper at all. Each call
checks its return value, then errno, and raises an ``OSError`` that says what was
being done, so a sandbox that cannot be built fails loudly instead of running
open.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

MNT_DETACH = 0x2
MOUNT_ATTR_RDONLY = 0x1
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
SYS_MOUNT_SETATTR = 442  # x86_64 and the generic table (aarch64) agree
# clone(2) takes (flags, stack, parent_tid, child_tid|tls, tls|child_tid): with a null
# stack and no *_TID or SETTLS flag only ``flags`` counts, whatever the order.
SYS_CLONE = {"x86_64": 56, "aarch64": 220, "riscv64": 220}.get(platform.machine())


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.unshare.argtypes = [ctypes.c_int]
_libc.unshare.restype = ctypes.c_int
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.mount.restype = ctypes.c_int
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.umount2.restype = ctypes.c_int
_libc.syscall.restype = ctypes.c_long


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        # The errno travels in the text too: it reaches the ledger and the doctor.
        raise OSError(err, f"{what}: {os.strerror(err)} [{errno.errorcode.get(err, err)}]")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def clone(flags: int) -> int:
    """fork(2) straight into new namespaces: clone(2) with ``flags`` (CLONE_NEW*), as
    bubblewrap and nsjail start their sandboxes. The child is at once pid 1 of its PID
    namespace with no process in between, and its parent, still outside, can write the
    child's user-namespace id maps. Returns 0 in the child, its pid in the parent.

    Only for a single-threaded caller (the zygote): unlike ``os.fork`` this runs no
    at-fork handlers, which have nothing to reset when no other thread exists.
    """
    if not flags:
        return os.fork()
    if SYS_CLONE is None:
        raise OSError(errno.ENOSYS, f"clone with namespaces on {platform.machine()}")
    pid = int(
        _libc.syscall(SYS_CLONE, ctypes.c_ulong(flags | signal.SIGCHLD), None, None, None, None)
    )
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(
            err, f"clone({flags:#x}): {os.strerror(err)} [{errno.errorcode.get(err, err)}]"
        )
    return pid


def mount(
    source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None
) -> None:
    rc = _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data))
    what = fstype or ("bind" if flags & MS_BIND else "flags")
    _check(rc, " ".join(p for p in ("mount", what, source, "on", target) if p))


def umount(target: str, *, detach: bool = True) -> None:
    _check(_libc.umount2(_b(target), MNT_DETACH if detach else 0), f"umount {target}")


def make_private() -> None:
    """Nothing this namespace mounts propagates back to the host's tree."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def set_read_only(path: str, *, read_only: bool, recursive: bool) -> None:
    """mount_setattr(2): flip MOUNT_ATTR_RDONLY on the mount at ``path`` (and beneath it)."""
    attr = _MountAttr(
        attr_set=MOUNT_ATTR_RDONLY if read_only else 0,
        attr_clr=0 if read_only else MOUNT_ATTR_RDONLY,
    )
    rc = _libc.syscall(
        SYS_MOUNT_SETATTR,
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.c_uint(AT_RECURSIVE if recursive else 0),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(int(rc), f"mount_setattr {path} {'ro' if read_only else 'rw'}")


def bind(source: str, target: str, *, read_only: bool = True) -> None:
    mount(source, target, None, MS_BIND)
    # A bind ignores MS_RDONLY on the first call and copies the source mount's flags;
    # the remount sets exactly what is wanted.
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
    mount(None, target, None, flags)


def tmpfs(
    target: str,
    *,
    size_bytes: int,
    mode: int = 0o700,
    uid: int | None = None,
    gid: int | None = None,
    read_only: bool = False,
    inodes: int | None = None,
) -> None:
    options = f"size={max(size_bytes, 4096)},mode={mode:o}"
    if uid is not None:
        options += f",uid={uid}"
    if gid is not None:
        options += f",gid={gid}"
    if inodes is not None:
        options += f",nr_inodes={inodes}"
    flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
    mount("tmpfs", target, "tmpfs", flags, options)


def mount_proc() -> None:
    """A /proc that shows only this PID namespace (the connector's pid is not in it)."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def write_own_id_maps_of(pid: int, uid: int, gid: int) -> None:
    """From outside, as the namespace's unprivileged owner: map only our own uid and gid
    into ``pid``'s fresh user namespace (no other ids exist there); setgroups is denied,
    as the kernel requires before an unprivileged gid_map."""
    with open(f"/proc/{pid}/setgroups", "w") as f:
        f.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def write_id_maps_of(pid: int, uid: int, gid: int) -> None:
    """From outside (with CAP_SETUID/CAP_SETGID there): map root and the action's ids of
    ``pid``'s new user namespace, each to itself; setgroups stays allowed, so the action
    can still clear its groups."""
    for kind, ids in (("uid", {0, uid}), ("gid", {0, gid})):
        with open(f"/proc/{pid}/{kind}_map", "w") as f:
            f.write("".join(f"{i} {i} 1\n" for i in sorted(ids)))
