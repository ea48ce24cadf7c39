"""Reading operator-written files without being hung or flooded by what is at the path."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotARegularFile(OSError):
    """The path holds a FIFO, a device, a directory… — never read as configuration."""


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    Opened non-blocking and checked with ``fstat`` on the open descriptor, so a FIFO
    planted at the path cannot hang the reader and a swap after a check changes nothing.
    Raises ``FileNotFoundError``, ``NotARegularFile``, or ``OSError`` (too large included).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(f"{path} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path} is {st.st_size} bytes; the limit is {limit}")
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise OSError(f"{path} grew past the {limit}-byte limit while being read")
        return data
    finally:
        os.close(fd)
