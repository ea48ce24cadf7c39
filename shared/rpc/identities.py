"""Routing ids on a ROUTER: one live connection per id, and a refusal for a second.

A ROUTER knows its peers by the routing id each one presents (``ZMQ_ROUTING_ID``, or
one libzmq makes up). Two live connections presenting the same id cannot both be
served: libzmq either ignores the second one for good, with no error anywhere
(``ROUTER_HANDOVER`` off), or hands the id to it, after which the first silently gets
nothing more (``ROUTER_HANDOVER`` on, which reconnecting fixed-id peers need). libzmq
without its draft API says nothing either way, so this module watches for itself:

* a socket monitor tells which connections (file descriptors) are open;
* each request's frame names the connection it came on (``ZMQ_SRCFD``);
* the first connection an id is seen on holds it while it stays open. A request for
  that id from another connection while the holder is still open is a duplicate:
  that connection is refused (``routing-id-in-use``) for as long as it stays open,
  unless the holder turns out to be closing within a short grace (``settle``),
  and the holder, whose id libzmq has just handed over, is disconnected once so that
  its socket reconnects and takes its id back (the refused connection then gets
  nothing more from libzmq). Logged as ``rpc.routing_id.duplicate``.

A peer that reconnects after its old connection closed (a restart, a dropped link) is
not a duplicate: the close is seen on the monitor before its first new request.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import select
import socket
from enum import Enum
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from sensorium.shared.logs import LibraryLogger

log = LibraryLogger("sensorium.rpc")
# How long a suspected duplicate waits for its id's holder to turn out to be closing.
SETTLE_STEPS = 50
SETTLE_STEP_S = 0.02
_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
_serial = itertools.count()
# What a peer that closed its end looks like to poll(2); POLLRDHUP is Linux's own.
_HUNG_UP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR
# Plain ints: IntEnum/IntFlag arithmetic costs microseconds, and drain runs per request.
_SOCK_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


class Verdict(Enum):
    ADMIT = "admit"
    REFUSE = "refuse"
    SUSPECT = "suspect"  # another open connection holds the id: ``settle`` decides


def printable(ident: bytes) -> str:
    """A routing id as it can be logged: text when it is text, else hex."""
    if ident and ident[0] != 0 and ident.isascii() and ident.decode().isprintable():
        return ident.decode()
    return "0x" + ident.hex()


class RoutingIds:
    """Which open connection holds each routing id on one ROUTER socket.

    ``admit(ident, fd)`` is called with every request's routing id and source fd; it
    is False for a connection that must be refused. Bound in memory by the open
    connections: a connection's entries go when the monitor reports it closed.
    """

    def __init__(self, sock: zmq.Socket[Any], server: str) -> None:
        self._server = server
        self._router = sock
        addr = f"inproc://sensorium-rpc-ids-{os.getpid()}-{next(_serial)}"
        sock.monitor(addr, _EVENTS)
        # A plain (not asyncio) view of the same context: the monitor is drained
        # synchronously, right before each judgement, so it is never behind.
        self._view: zmq.Context[zmq.Socket[Any]] = zmq.Context.shadow(sock.context.underlying)
        self._monitor: zmq.Socket[Any] = self._view.socket(zmq.PAIR)
        # Unbounded, so a burst of connections cannot drop a close we must not miss.
        self._monitor.setsockopt(zmq.RCVHWM, 0)
        self._monitor.setsockopt(zmq.LINGER, 0)
        self._monitor.connect(addr)
        self._open: dict[int, int] = {}  # fd -> its socket's inode, while open
        self._holder: dict[bytes, int] = {}  # routing id -> the fd that holds it
        self._held_by: dict[int, set[bytes]] = {}  # fd -> the ids it holds
        self._refused: set[int] = set()  # fds refused as duplicates, while open
        self.duplicates = 0

    def __repr__(self) -> str:
        return (
            f"<RoutingIds {self._server} open={len(self._open)} ids={len(self._holder)} "
            f"refused={len(self._refused)} duplicates={self.duplicates}>"
        )

    def drain(self) -> None:
        """Apply every connection event the monitor has queued."""
        # Asked first, as every request drains: a receive that finds nothing raises,
        # and building that exception cost more than the rest of a drain.
        if not int(self._monitor.get(_SOCK_EVENTS)) & _POLLIN:
            return
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._open[fd] = _inode(fd)
            else:
                self._closed(fd)

    def _closed(self, fd: int) -> None:
        self._open.pop(fd, None)
        self._refused.discard(fd)
        for ident in self._held_by.pop(fd, ()):
            if self._holder.get(ident) == fd:
                del self._holder[ident]

    def admit(self, ident: bytes, fd: int) -> Verdict:
        """Whether the connection ``fd`` may speak as ``ident``: at once, never, or once
        ``settle`` has seen whether the id's holder is closing."""
        if fd < 0:  # no source fd (inproc): nothing to compare
            return Verdict.ADMIT
        self.drain()
        if fd in self._refused:
            return Verdict.REFUSE
        holder = self._holder.get(ident)
        if holder == fd:  # the usual case: the connection that holds it
            return Verdict.ADMIT
        if holder is None or not self._alive(holder):
            self._hold(ident, fd)
            return Verdict.ADMIT
        return Verdict.SUSPECT

    async def settle(self, ident: bytes, fd: int) -> bool:
        """For a SUSPECT: True once the holder is seen closing within the grace (a peer
        that closed and reopened its socket, faster than its old stream's end reached
        libzmq); else the connection is a duplicate, refused from now on."""
        for _ in range(SETTLE_STEPS):
            await asyncio.sleep(SETTLE_STEP_S)
            self.drain()
            if fd in self._refused:
                return False
            holder = self._holder.get(ident)
            if holder is None or holder == fd or not self._alive(holder):
                self._hold(ident, fd)
                return True
        holder = self._holder[ident]
        self.duplicates += 1
        self._refused.add(fd)
        bounced = self._bounce(holder)
        log.warning(
            "rpc.routing_id.duplicate",
            server=self._server,
            routing_id=printable(ident),
            holder_fd=holder,
            refused_fd=fd,
            holder_reconnects=bounced,
        )
        return False

    def _hold(self, ident: bytes, fd: int) -> None:
        self._holder[ident] = fd
        self._held_by.setdefault(fd, set()).add(ident)

    def _alive(self, fd: int) -> bool:
        """Open, and its peer has not hung up: a peer that closed and reconnected at
        once may come back before libzmq has read the end of its old stream."""
        if fd not in self._open or _inode(fd) != self._open[fd]:
            return False
        poller = select.poll()
        poller.register(fd, _HUNG_UP)
        return not any(ev & _HUNG_UP for _fd, ev in poller.poll(0))

    def _bounce(self, fd: int) -> bool:
        """Disconnect the holder's connection so its socket reconnects and takes its id
        back (libzmq handed the id to the newcomer). Only the very socket seen opened:
        a number reused by another file since is left alone. The check and the shutdown
        act on a duplicate of the descriptor, so libzmq closing ``fd`` (and the number
        being reused) in between cannot make them reach another file."""
        inode = self._open.get(fd)
        if inode is None:
            return False
        try:
            dup = os.dup(fd)
        except OSError:
            return False  # closed already
        try:
            if _inode(dup) != inode:
                return False
            # shutdown, not close: it ends the connection for every descriptor of it, so
            # libzmq sees the end of the stream and closes its own (the monitor then
            # reports it); closing our duplicate alone would end nothing.
            with socket.socket(fileno=dup) as sock:
                dup = -1  # the socket object owns it now and closes it on exit
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
        finally:
            if dup >= 0:
                os.close(dup)
        return True

    def close(self) -> None:
        try:
            self._router.disable_monitor()
        except zmq.ZMQError:
            pass  # the ROUTER is already closed
        self._monitor.close(linger=0)


def _inode(fd: int) -> int:
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return -1
