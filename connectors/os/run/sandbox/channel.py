"""The control socket over which a sandbox's init hands the connector what it built.

Once the action's namespaces and mounts exist, the init sends one ``setup``
message whose fds are, in plan order, the exported mounts (C3's upper-layer
tmpfs, C5's artifact tmpfs) and then C4's listeners and DNS socket. A directory
fd keeps its mount alive after the namespace that made it is gone, so the
connector reads what the action left there without any mount of its own: no
privilege needed, and nothing to unmount after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

# SCM_MAX_FD: the most one message carries. C4 sends two listeners (IPv4, IPv6) per
# declared port and protocol; the catalog refuses an allowlist that needs more.
MAX_FDS = 253


class SetupChannel:
    """One action's control socket: ``theirs`` goes to the sandbox, the fds come back."""

    def __init__(self) -> None:
        self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ours.setblocking(False)
        self._fds: list[int] | None = None
        self._arrived: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"<SetupChannel fds={self._fds}>"

    def begin(self) -> None:
        """Start listening: call from the event loop before the spawn."""
        self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        self._loop.add_reader(self.ours.fileno(), self._readable)

    def _readable(self) -> None:
        if self._try_receive() and self._loop is not None:
            self._loop.remove_reader(self.ours.fileno())

    def _try_receive(self) -> bool:
        """True once the message (or EOF) was read."""
        try:
            msg, fds, _f, _a = socket.recv_fds(self.ours, 64, MAX_FDS)
        except BlockingIOError:
            return False
        except OSError:
            msg, fds = b"", []
        if msg != b"setup":
            for fd in fds:
                os.close(fd)
            fds = []
        self._fds = list(fds)
        if self._arrived is not None:
            self._arrived.set()
        return True

    async def wait(self) -> list[int]:
        """The fds, once the init sent them (C4 needs its listeners while it runs)."""
        assert self._arrived is not None
        await self._arrived.wait()
        return list(self._fds or [])

    def collect(self) -> list[int]:
        """After the sandbox is gone: the fds it sent, or [] when it failed before."""
        if self._fds is None:
            self._try_receive()
        return list(self._fds or [])

    def close_theirs(self) -> None:
        """Once the zygote holds its copy: a sandbox that dies now gives us EOF."""
        with contextlib.suppress(OSError):
            self.theirs.close()

    def close(self) -> None:
        """Close our end and every fd received (callers dup what they keep)."""
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.ours.fileno())
        for fd in self._fds or []:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        self.ours.close()
        self.close_theirs()
