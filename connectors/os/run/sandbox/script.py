"""C2: open an allowlisted script without any escape, pin its bytes, seal them in a memfd.

The script is opened with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS)`` from a descriptor of its allowlisted root, so neither a
symlink, nor ``..``, nor an absolute path, nor ``/proc`` magic can leave the root.
Its bytes are read once, hashed, and copied into a sealed memfd; the interpreter
reads the memfd (``/dev/fd/3``), so swapping the file after the check changes
nothing that runs.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import stat
from dataclasses import dataclass

from sensorium.shared.diagnostics import OsErrorCode

SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
MFD_CLOEXEC = 0x1
MFD_ALLOW_SEALING = 0x2
F_ADD_SEALS = 1033
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE = 0x1, 0x2, 0x4, 0x8
# The fd number the interpreter finds the script at.
SCRIPT_FD = 3
SCRIPT_PATH = f"/dev/fd/{SCRIPT_FD}"
MAX_SCRIPT_BYTES = 16 * 1024 * 1024


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class ScriptError(Exception):
    """The script cannot run as declared; ``code`` is the seed's diagnostic code."""

    def __init__(self, code: OsErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SealedScript:
    fd: int
    sha256: str
    size: int


def openat2_beneath(root_fd: int, relative: str) -> int:
    how = _OpenHow(
        flags=os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
        mode=0,
        resolve=RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )
    fd = _libc.syscall(
        SYS_OPENAT2,
        ctypes.c_int(root_fd),
        ctypes.c_char_p(os.fsencode(relative)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), relative)
    return int(fd)


def _under(path: str, roots: list[str]) -> tuple[str, str] | None:
    for root in roots:
        prefix = root.rstrip("/") + "/"
        if path.startswith(prefix) and len(path) > len(prefix):
            return root, path[len(prefix) :]
    return None


def seal(path: str, roots: list[str], pin: str | None) -> SealedScript:
    """The script's bytes, verified and sealed; the caller closes ``fd``."""
    found = _under(path, roots)
    if found is None:
        raise ScriptError(
            OsErrorCode.WORKING_DIRECTORY_FORBIDDEN,
            f"{path} is not beneath any allowlisted script root ({', '.join(roots)})",
        )
    root, relative = found
    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ScriptError(
            OsErrorCode.WORKING_DIRECTORY_FORBIDDEN, f"script root {root}: {exc.strerror}"
        ) from None
    try:
        fd = openat2_beneath(root_fd, relative)
    except OSError as exc:
        reason = {
            errno.ELOOP: "a symlink on the way is refused",
            errno.EXDEV: "the path leaves the allowlisted root",
            errno.ENOENT: "no such file",
        }.get(exc.errno or 0, exc.strerror)
        code = (
            OsErrorCode.WORKING_DIRECTORY_FORBIDDEN
            if exc.errno in (errno.ELOOP, errno.EXDEV)
            else OsErrorCode.SCRIPT_NOT_EXECUTABLE
        )
        raise ScriptError(code, f"{path}: {reason}") from None
    finally:
        os.close(root_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ScriptError(OsErrorCode.SCRIPT_NOT_EXECUTABLE, f"{path} is not a regular file")
        if st.st_nlink > 1:
            # Another name of the same bytes may live outside the root, writable.
            raise ScriptError(
                OsErrorCode.WORKING_DIRECTORY_FORBIDDEN,
                f"{path} has {st.st_nlink} hard links; a script must have exactly one",
            )
        if pin is None:
            refuse_foreign_writers(path, st)
            refuse_foreign_writers(root, os.stat(root))
        if st.st_size > MAX_SCRIPT_BYTES:
            raise ScriptError(
                OsErrorCode.SCRIPT_NOT_EXECUTABLE,
                f"{path} is {st.st_size} bytes; scripts are limited to {MAX_SCRIPT_BYTES}",
            )
        data = _read(fd, MAX_SCRIPT_BYTES + 1)
    finally:
        os.close(fd)
    digest = hashlib.sha256(data).hexdigest()
    if pin is not None and digest != pin:
        raise ScriptError(
            OsErrorCode.SCRIPT_HASH_MISMATCH,
            f"{path} has sha256 {digest}, the declaration pins {pin}; "
            "review the change and update executable.sha256",
        )
    return SealedScript(_memfd(data), digest, len(data))


def refuse_foreign_writers(path: str, st: os.stat_result) -> None:
    """An unpinned script (or its root) that someone but root or the node's own user can
    write may be swapped between signing and running: refuse it (a pin makes it safe)."""
    trusted = {0, os.geteuid()}
    writable_by_others = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0)
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_uid not in trusted or (writable_by_others and not sticky_dir):
        raise ScriptError(
            OsErrorCode.WORKING_DIRECTORY_FORBIDDEN,
            f"{path} can be written by uid {st.st_uid} or by others (mode "
            f"{stat.S_IMODE(st.st_mode):o}): pin the script with executable.sha256, or make it "
            "writable only by root or the node's user",
        )


def _read(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
        total += len(chunk)
        if total >= limit:
            break
    return b"".join(chunks)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("sensorium-script", MFD_CLOEXEC | MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
