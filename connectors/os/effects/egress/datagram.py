"""C4 over UDP: datagrams to a declared ``(host, port, "udp")`` relayed as flows, byte-capped.

Inside the action's namespace one socket per declared UDP port and address family
receives every datagram sent to that port, whatever the address (every address is
local there); IP_PKTINFO / IPV6_PKTINFO say which address it was sent to. A flow is
one (program's address, destination) pair. Its first datagram admits it as a TCP
connection is admitted (a declared destination, within the open-connection limits);
otherwise the datagram is dropped and counted as a refusal, each time. An admitted
flow gets a host-side socket connected to the declared endpoint (a name's answers
screened as for TCP: a refused one cuts the flow for good), which carries its
datagrams out and the replies back; a reply reaches the program from the address it
wrote to, as a real peer's would.

Caps are those of TCP, counted per datagram: its payload plus ``UDP_HEADER`` (8) bytes,
so that empty datagrams are not free (the transcript keeps payload bytes). A datagram
that would cross ``max_bytes_per_connection`` or ``max_bytes_total`` is dropped whole (half a
datagram is no datagram), the flow is cut — nothing more either way — and its note
says which cap. A flow holds its host-side socket (one connector fd) until it is cut
or the action ends; its transcript row runs from its first datagram to its last.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from sensorium.connectors.os.effects.egress.answers import RefusedAnswer
from sensorium.connectors.os.effects.egress.conn import Conn
from sensorium.connectors.os.effects.egress.netsetup import IP_PKTINFO

MAX_DATAGRAM = 65535
UDP_HEADER = 8  # charged per datagram on top of its payload: an empty one costs too
# Datagrams held while a flow's endpoint is resolved; past either bound (how many, or
# their charged bytes) further ones drop, as a full queue on any network would.
MAX_PENDING_DATAGRAMS = 64
MAX_PENDING_BYTES = 65536
PER_WAKEUP = 64  # bounded per wakeup, so a flood cannot starve the rest of the relay
_IN_PKTINFO = "=i4s4s"  # ipi_ifindex, ipi_spec_dst, ipi_addr
_IN6_PKTINFO = "=16sI"  # ipi6_addr, ipi6_ifindex
_CMSG_SPACE = socket.CMSG_SPACE(max(struct.calcsize(_IN_PKTINFO), struct.calcsize(_IN6_PKTINFO)))


class Owner(Protocol):
    """What the relay that holds these flows lends them: admission, caps, names, time."""

    def admit(self, dst_ip: str, dst_port: int, *, udp: bool) -> Conn | None: ...

    def charge(self, conn: Conn, payload: int, *, outbound: bool) -> str: ...

    def release(self, conn: Conn) -> None: ...

    def resolve(self, host: str, port: int) -> Awaitable[list[tuple[str, int]]]: ...


def destination(sock: socket.socket, ancdata: list[tuple[int, int, bytes]]) -> str | None:
    """The address a received datagram was sent to, from its packet info."""
    for level, kind, data in ancdata:
        if sock.family == socket.AF_INET and (level, kind) == (socket.IPPROTO_IP, IP_PKTINFO):
            return socket.inet_ntop(socket.AF_INET, struct.unpack(_IN_PKTINFO, data[:12])[2])
        if sock.family == socket.AF_INET6 and (level, kind) == (
            socket.IPPROTO_IPV6,
            socket.IPV6_PKTINFO,
        ):
            return socket.inet_ntop(socket.AF_INET6, data[:16])
    return None


def _source(family: int, ip: str) -> list[tuple[int, int, bytes]]:
    """Packet info that makes a reply leave from ``ip`` (the address the program wrote to)."""
    if family == socket.AF_INET:
        info = struct.pack(_IN_PKTINFO, 0, socket.inet_aton(ip), b"\0\0\0\0")
        return [(socket.IPPROTO_IP, IP_PKTINFO, info)]
    info = struct.pack(_IN6_PKTINFO, socket.inet_pton(socket.AF_INET6, ip), 0)
    return [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, info)]


class _Flow:
    def __init__(
        self, conn: Conn, inside: socket.socket, peer: tuple[Any, ...], dst_ip: str
    ) -> None:
        self.conn = conn
        self.inside = inside  # the namespace-side socket replies leave through
        self.peer = peer
        self.dst_ip = dst_ip
        self.upstream: socket.socket | None = None
        self.pending: list[bytes] = []
        self.pending_bytes = 0  # charged bytes of ``pending``, kept as it grows
        self.cut = False


class DatagramRelay:
    """Every UDP flow of one action; the owner (the action's relay) keeps the ledger."""

    def __init__(
        self,
        owner: Owner,
        *,
        connect_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._owner = owner
        self._connect_timeout = connect_timeout
        self._clock = clock
        self._inside: list[socket.socket] = []
        self._flows: dict[tuple[int, tuple[Any, ...], str, int], _Flow] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def start(self, sock: socket.socket) -> None:
        """Serve one namespace-side UDP socket; the relay owns it from now on."""
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._inside.append(sock)
        self._loop.add_reader(sock.fileno(), self._from_program, sock)

    def _from_program(self, sock: socket.socket) -> None:
        for _ in range(PER_WAKEUP):
            try:
                data, ancdata, _flags, peer = sock.recvmsg(MAX_DATAGRAM, _CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # an ICMP error for an earlier reply: nothing to do
            dst_ip = destination(sock, ancdata)
            if dst_ip is None or self._closed:
                continue
            dst_port = sock.getsockname()[1]
            key = (sock.fileno(), tuple(peer[:2]), dst_ip, dst_port)
            flow = self._flows.get(key)
            # A flow cut by a cap, or refused where its name resolved to, stays cut (a new
            # source port is a new flow, as a new connection is); one whose endpoint did
            # not answer is tried afresh.
            if flow is None or (flow.cut and not flow.conn.note.startswith(("capped", "refused"))):
                conn = self._owner.admit(dst_ip, dst_port, udp=True)
                if conn is None:
                    continue
                flow = _Flow(conn, sock, peer, dst_ip)
                self._flows[key] = flow
                self._track(self._open_upstream(flow))
            if flow.cut:
                continue  # cut by a cap: the flow stays cut, as a capped TCP connection
            if flow.upstream is None:
                cost = len(data) + UDP_HEADER
                if (
                    len(flow.pending) < MAX_PENDING_DATAGRAMS
                    and flow.pending_bytes + cost <= MAX_PENDING_BYTES
                ):
                    flow.pending.append(data)
                    flow.pending_bytes += cost
                continue
            self._send_up(flow, data)

    def _track(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_upstream(self, flow: _Flow) -> None:
        e = flow.conn.endpoint
        target = f"{e.host}:{e.port}"
        errors: list[str] = []
        try:
            async with asyncio.timeout(self._connect_timeout):
                addresses = await self._owner.resolve(e.host, e.port)
        except RefusedAnswer as exc:
            self._cut(flow, str(exc))
            return
        except (OSError, TimeoutError) as exc:
            self._cut(flow, f"connect to {target} failed: cannot resolve it ({exc})")
            return
        for ip, port in addresses:
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            up = socket.socket(family, socket.SOCK_DGRAM)
            try:
                up.setblocking(False)
                up.connect((ip, port))
            except OSError as exc:
                up.close()
                errors.append(f"{ip}:{port}: {exc.strerror or exc}")
                continue
            if flow.cut or self._closed:
                up.close()
                return
            flow.upstream = up
            assert self._loop is not None
            self._loop.add_reader(up.fileno(), self._from_upstream, flow)
            pending, flow.pending, flow.pending_bytes = flow.pending, [], 0
            for data in pending:
                if not flow.cut:
                    self._send_up(flow, data)
            return
        shown = "; ".join(errors) or "name resolved to nothing"
        self._cut(flow, f"connect to {target} failed: no address answered ({shown})")

    def _send_up(self, flow: _Flow, data: bytes) -> None:
        assert flow.upstream is not None
        note = self._owner.charge(flow.conn, len(data), outbound=True)
        if note:
            self._cut(flow, note)
            return
        with contextlib.suppress(OSError):  # lost, as a datagram may be on any network
            flow.upstream.send(data)
        flow.conn.ended = self._clock()

    def _from_upstream(self, flow: _Flow) -> None:
        for _ in range(PER_WAKEUP):
            if flow.upstream is None or flow.cut:
                return
            try:
                data = flow.upstream.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue  # ICMP unreachable for an earlier datagram: the network's doing
            note = self._owner.charge(flow.conn, len(data), outbound=False)
            if note:
                self._cut(flow, note)
                return
            with contextlib.suppress(OSError):
                flow.inside.sendmsg([data], _source(flow.inside.family, flow.dst_ip), 0, flow.peer)
            flow.conn.ended = self._clock()

    def _cut(self, flow: _Flow, note: str) -> None:
        """End a flow: its socket closed, its slot given back; ``note`` says why."""
        if flow.cut:
            return
        flow.cut = True
        flow.pending, flow.pending_bytes = [], 0
        if note:
            flow.conn.note = note
        if flow.conn.ended is None:
            flow.conn.ended = self._clock()
        up, flow.upstream = flow.upstream, None
        if up is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(up.fileno())
            up.close()
        self._owner.release(flow.conn)

    async def close(self, grace: float) -> None:
        """Stop serving, end every flow, close every socket; idempotent, bounded."""
        self._closed = True
        loop_open = self._loop is not None and not self._loop.is_closed()
        for sock in self._inside:
            if loop_open and self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self._inside.clear()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        for flow in self._flows.values():
            self._cut(flow, "")

    def __repr__(self) -> str:
        live = sum(not f.cut for f in self._flows.values())
        return f"<DatagramRelay sockets={len(self._inside)} flows={len(self._flows)} live={live}>"
