"""Reading a pipe from the event loop with one reader callback and nothing else.

asyncio's ``connect_read_pipe`` builds a transport and a protocol for each pipe, wraps
the fd in a file object, and costs the caller a loop turn before the first byte can
arrive (``connection_made`` and the reader are scheduled, then awaited). An action
has three pipes (stdout, stderr, its init's report), so that was three turns and
three transports on every directive's path. Here a pipe is its fd, a callback that
takes each chunk as it is read, and a future that is done at EOF.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

# One pipe buffer's worth (Linux's default is 64 KiB). asyncio reads 256 KiB, which
# costs an mmap and munmap per read for a buffer that is almost always mostly empty.
READ_CHUNK = 64 * 1024


class PipeReader:
    """Owns ``fd`` (made non-blocking) from now on: ``on_data`` gets each chunk read,
    ``on_eof`` is called once at EOF or ``close``, and ``closed`` is then done."""

    __slots__ = ("_loop", "_on_data", "_on_eof", "closed", "fd")

    def __init__(
        self,
        fd: int,
        on_data: Callable[[bytes], None],
        on_eof: Callable[[], None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.fd = fd
        self._on_data = on_data
        self._on_eof = on_eof
        self.closed: asyncio.Future[None] = self._loop.create_future()
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._ready)

    def __repr__(self) -> str:
        return f"<PipeReader fd={self.fd}>"

    def _ready(self) -> None:
        try:
            data = os.read(self.fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # EIO and the like: nothing more will come
            data = b""
        if data:
            self._on_data(data)
        else:
            self.close()

    def close(self) -> None:
        """Stop reading (a writer that outlived its action then gets EPIPE)."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        live = not self._loop.is_closed()
        if live:
            self._loop.remove_reader(fd)
        os.close(fd)
        if live and not self.closed.done():
            self.closed.set_result(None)
        on_eof, self._on_eof = self._on_eof, None
        if on_eof is not None:
            on_eof()
