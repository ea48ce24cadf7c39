"""A blocking zmq socket served from the event loop, without a Future per message.

pyzmq's asyncio sockets pay for generality on every message: a Future, an enum-heavy
event check, and a zero-delay callback that costs an extra loop turn. A request/reply
server or client needs much less: receive whatever is queued, and sleep on the socket's
fd only when nothing is. Sends here never wait (``NOBLOCK``): a full queue is the
caller's error to handle, as it already was.

libzmq's fd is edge-like: it signals that the socket's *state may have changed*, and
any call that processes the socket's commands (a send, a ``ZMQ_EVENTS`` read) consumes
that signal. So a receive tries the socket before it sleeps; every wake-up reads
``ZMQ_EVENTS`` (which also keeps the level-triggered loop from spinning on a stale
signal); and a send made while a receive sleeps re-checks for input, because the send
may have consumed the signal of a message that arrived meanwhile.

A server's receive loop can go further (``pump``): the loop's reader callback itself
takes each message and hands it to a plain function, so a request answered there costs
one loop turn, with no Future and no task step between the wake-up and the answer.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import zmq

_monitors = itertools.count()
# Plain ints: the IntEnum/IntFlag arithmetic costs microseconds on every poll.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
# Messages one reader callback of ``pump`` takes before it lets the loop run the rest:
# a flood from one socket must not starve the loop's other work.
PUMP_BATCH = 64


def blocking_socket(ctx: zmq.Context[Any], kind: int) -> zmq.Socket[bytes]:
    """A blocking socket in ``ctx``, whatever kind of socket the context itself makes
    (an asyncio context makes asyncio ones)."""
    sock: zmq.Socket[bytes] = zmq.Socket(ctx, kind)
    return sock


def monitor_of(sock: zmq.Socket[Any], events: int) -> zmq.Socket[bytes]:
    """A blocking PAIR socket receiving ``sock``'s monitor ``events`` (pyzmq's own
    ``get_monitor_socket`` makes one of its context's kind)."""
    addr = f"inproc://sensorium-monitor-{next(_monitors)}"
    sock.monitor(addr, events)
    pair = blocking_socket(sock.context, zmq.PAIR)
    pair.setsockopt(zmq.LINGER, 0)
    pair.connect(addr)
    return pair


class Channel:
    """One socket; at most one receiver at a time (its owner's receive loop)."""

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self.sock = sock
        self._fd: int = sock.FD
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        # While ``pump`` runs: who takes each message, and what ends the pump.
        self._handle: Callable[[list[zmq.Frame]], None] | None = None
        self._pumped: asyncio.Future[None] | None = None
        self._draining = False
        self._scheduled = False  # a drain waits in the loop's ready queue
        # Every drain runs in the pump owner's context, never in that of whoever sent
        # last (call_soon copies its caller's: a handler's bound request/id, say).
        self._ctx: contextvars.Context | None = None

    def __repr__(self) -> str:
        return (
            f"<Channel fd={self._fd} waiting={self._waiter is not None} "
            f"pumping={self._handle is not None}>"
        )

    async def pump(self, handle: Callable[[list[zmq.Frame]], None]) -> None:
        """Give every message (as frames, not copied) to ``handle``, called from the
        loop's reader callback, until the channel is closed (``ZMQError`` ENOTSOCK) or
        ``handle`` raises (that exception ends the pump). ``handle`` must not block; work
        that waits goes to a task of its own. Not together with a ``recv*``."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._handle, self._pumped = handle, done
        self._ctx = contextvars.copy_context()
        self._listen(loop)
        self._schedule()  # what was queued before we listened
        try:
            await done
        finally:
            self._handle = self._pumped = None

    def _schedule(self) -> None:
        """One drain in a later turn of the loop (at most one waits at a time)."""
        if not self._scheduled and self._loop is not None and self._ctx is not None:
            self._scheduled = True
            self._loop.call_soon(self._scheduled_drain, context=self._ctx)

    def _scheduled_drain(self) -> None:
        self._scheduled = False
        self._drain()

    def _drain(self) -> None:
        """Take and hand over what is queued, up to ``PUMP_BATCH``; more, in a later turn."""
        handle, done = self._handle, self._pumped
        if handle is None or done is None or done.done() or self._draining:
            return
        self._draining = True
        try:
            for _ in range(PUMP_BATCH):
                if not self._pollin():
                    return
                try:
                    frames: list[zmq.Frame] = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                handle(frames)
            self._schedule()
        except BaseException as exc:  # the pump's owner hears of it
            if not done.done():
                done.set_exception(exc)
        finally:
            self._draining = False

    async def recv_multipart(self) -> list[zmq.Frame]:
        """The next message, as frames (not copied)."""
        sock = self.sock
        while True:
            # Asked first: a receive that finds nothing raises, and raising costs more.
            if self._pollin():
                try:
                    frames: list[zmq.Frame] = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    return frames
                except zmq.Again:
                    pass
            await self._readable()

    async def recv_parts(self) -> list[bytes]:
        """The next message, as bytes."""
        sock = self.sock
        while True:
            # Asked first: a receive that finds nothing raises, and raising costs more.
            if self._pollin():
                try:
                    parts: list[bytes] = sock.recv_multipart(zmq.NOBLOCK)
                    return parts
                except zmq.Again:
                    pass
            await self._readable()

    async def recv(self) -> bytes:
        """The next single-part message's bytes."""
        sock = self.sock
        while True:
            # Asked first: a receive that finds nothing raises, and raising costs more.
            if self._pollin():
                try:
                    data: bytes = sock.recv(zmq.NOBLOCK)
                    return data
                except zmq.Again:
                    pass
            await self._readable()

    def send_multipart(self, frames: Sequence[Any]) -> None:
        """Queue a message now or raise (``zmq.Again``: the peer's queue is full;
        ``EHOSTUNREACH``: a ROUTER's peer is gone)."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        finally:
            self.recheck()

    def send(self, data: bytes) -> None:
        try:
            self.sock.send(data, zmq.NOBLOCK)
        finally:
            self.recheck()

    def close(self, linger: int = 0) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._loop = None
        # The receiver hears what a closed pyzmq socket would have told it.
        for waiter in (self._waiter, self._pumped):
            if waiter is not None and not waiter.done():
                waiter.set_exception(zmq.ZMQError(zmq.ENOTSOCK))
        self._waiter = None
        self.sock.close(linger=linger)

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            loop.add_reader(self._fd, self._wake)
            self._loop = loop

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        self._listen(loop)
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None

    def _pollin(self) -> bool:
        """Reading ZMQ_EVENTS processes the socket's commands (and spends the fd's signal)."""
        return bool(int(self.sock.get(_EVENTS)) & _POLLIN)

    def _wake(self) -> None:
        if self._handle is not None and self._ctx is not None:
            self._ctx.run(self._drain)
            return
        try:
            ready = self._pollin()
        except zmq.ZMQError:  # closed under us: wake the receiver to find out
            ready = True
        if ready:
            self._release()

    def recheck(self) -> None:
        """After anything that may process the socket's commands (a send, a read or a
        connect made on ``sock`` itself): wake a sleeping receive if input waits."""
        if self._waiter is not None and self._pollin():
            self._release()
        elif self._handle is not None and not self._draining and self._pollin():
            # A drain checks for input after each message it handed over; elsewhere a
            # send may have spent the signal of one that arrived meanwhile.
            self._schedule()

    def _release(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
