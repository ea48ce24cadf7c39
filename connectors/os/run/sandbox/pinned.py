"""A pinned binary, checked on the bytes that will run: the fd that was hashed is the one
the action is exec'd from (``fexecve``), so a swap of the path after the check changes
nothing. The hash is remembered per file identity (device, inode, size, mtime, ctime):
any write to the file changes its ctime, and the next spawn hashes it again."""

from __future__ import annotations

import hashlib
import os
import stat
import threading

from sensorium.connectors.os.run.sandbox.script import ScriptError
from sensorium.shared.diagnostics import OsErrorCode

_Identity = tuple[int, int, int, int, int]
_verified: dict[_Identity, str] = {}
_lock = threading.Lock()
MAX_CACHE = 1024


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _digest(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def open_pinned(path: str, pin: str) -> int:
    """An O_CLOEXEC fd of ``path`` whose bytes hash to ``pin``; the caller closes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ScriptError(OsErrorCode.SCRIPT_NOT_EXECUTABLE, f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ScriptError(OsErrorCode.SCRIPT_NOT_EXECUTABLE, f"{path} is not a regular file")
        key = _identity(st)
        with _lock:
            digest = _verified.get(key)
        if digest is None:
            digest = _digest(fd)
            with _lock:
                if len(_verified) >= MAX_CACHE:
                    _verified.clear()
                _verified[key] = digest
        if digest != pin:
            raise ScriptError(
                OsErrorCode.SCRIPT_HASH_MISMATCH,
                f"{path} has sha256 {digest}, the declaration pins {pin}; "
                "review the change and update executable.sha256",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd
