"""``logs/<process>.stderr``: what a child printed outside its log, bounded like the logs.

A child writes its stderr straight into the file (``O_APPEND``, opened at spawn), so
the supervisor bounds it from outside, with ``logs.max_bytes`` and ``logs.keep``: a
file past ``max_bytes`` becomes ``.stderr.1`` (older ones shift up, the one past
``keep`` is deleted). At spawn nobody holds the file and it is renamed. While a child
runs, the file's last ``max_bytes`` are copied to ``.1`` and the file is truncated
in place (logrotate's ``copytruncate``): the child's appends go on at the new end.
What the child writes between the copy and the truncation is lost; the work is
bounded by ``max_bytes`` whatever the file grew to. ``max_bytes: 0`` never rotates.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sensorium.shared.config import LogConfig

_COPY_CHUNK = 1024 * 1024


def stderr_path(logs_dir: Path, name: str) -> Path:
    return logs_dir / f"{name}.stderr"


def _numbered(path: Path, n: int) -> Path:
    return path.with_name(f"{path.name}.{n}")


def _shift(path: Path, keep: int) -> None:
    """``.keep`` is deleted, ``.n`` becomes ``.n+1``; ``.1`` is free afterwards."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_numbered(path, keep))
    for n in range(keep - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            os.replace(_numbered(path, n), _numbered(path, n + 1))


def _copy_tail(path: Path, target: Path, size: int, max_bytes: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    src = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        dst = os.open(target, flags, 0o640)
        try:
            offset = max(0, size - max_bytes)
            while offset < size:
                sent = os.sendfile(dst, src, offset, min(_COPY_CHUNK, size - offset))
                if sent == 0:
                    break
                offset += sent
        finally:
            os.close(dst)
    finally:
        os.close(src)


def rotate(path: Path, cfg: LogConfig, *, live: bool) -> bool:
    """Rotate ``path`` if it is past ``cfg.max_bytes``; True if it did. ``live``: a
    running child holds it (copy and truncate), else it is renamed."""
    if cfg.max_bytes == 0:
        return False
    try:
        size = os.stat(path, follow_symlinks=False).st_size
    except FileNotFoundError:
        return False
    if size <= cfg.max_bytes:
        return False
    _shift(path, cfg.keep)
    first = _numbered(path, 1)
    if live:
        _copy_tail(path, first, size, cfg.max_bytes)
        os.truncate(path, 0)
    else:
        os.replace(path, first)
    return True
