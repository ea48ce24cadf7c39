"""The egress relay: accepts an action's TCP connections and UDP datagrams, relays declared ones.

The listeners were opened inside the action's network namespace, IPv4 and IPv6; the
relay holds them outside it, so each accepted socket's local address is where the
program tried to go (for UDP, each datagram's packet info: see ``datagram``, whose
flows share this relay's caps, limits and transcript). A declared ``(host, port)``
with protocol tcp, http or https is connected from the host side and relayed byte
for byte (no TLS interception, no payload inspection, nothing stored but counts);
anything else is closed at once. A declared name is resolved afresh for each
connection, and an answer that would reach the host's own services (loopback,
link-local, ...: see ``answers``) is never connected: the connection's note says
``refused`` and why. An ``http``
or ``https`` connection is relayed only once its first request's Host (http) or its
ClientHello's server name (https) names the declared host (``sniff``); what names
another, or nothing that can be checked, is closed before anything is connected. Caps:
``max_bytes_per_connection`` (sent + received of one connection) and
``max_bytes_total`` (all connections of the action); a chunk that would cross a cap
is forwarded up to the cap, then both sides are closed. The caps count payload bytes,
and for UDP 8 more per datagram (its header), so that no datagram is free; the
transcript's ``bytes_sent`` / ``bytes_received`` stay payload bytes.

Connections held open at once are capped too, because each holds two of the
connector's fds (a UDP flow one) (``egress.max_connections_per_action``, and across every action
``egress.max_connections_total`` through one :class:`RelayBudget` per process): past
either, a new connection is closed at once and counted as a refusal, so an action
that opens too many loses those, never the connector its fds.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

from sensorium.connectors.os.effects.egress import answers, sniff
from sensorium.connectors.os.effects.egress.conn import Conn
from sensorium.connectors.os.effects.egress.datagram import UDP_HEADER, DatagramRelay
from sensorium.connectors.os.effects.egress.dns import DnsStub, SyntheticAddresses
from sensorium.connectors.os.effects.egress.netsetup import DNS_PORT
from sensorium.connectors.os.run.sandbox.channel import MAX_FDS
from sensorium.shared.config import EgressConfig
from sensorium.shared.wire.declaration import EgressNetwork, Endpoint
from sensorium.shared.wire.outcome import TranscriptRow

Resolver = Callable[[str, int], Awaitable[list[tuple[str, int]]]]
TCP_PROTOCOLS = frozenset({"tcp", "http", "https"})
NAMED_PROTOCOLS = frozenset({"http", "https"})  # relayed only to the name declared
CHUNK = 65536
MAX_CONNECTIONS = 1024  # transcript rows per action; the outcome frame is bounded
REFUSALS_KEPT = 32
CLOSE_GRACE = 2.0


def unsupported_endpoints(egress: EgressNetwork) -> list[str]:
    """One human-readable gap per declared endpoint this relay cannot carry: UDP port 53
    (the DNS stub holds it in the namespace), and more distinct ports than one setup
    message can hand over (two sockets, IPv4 and IPv6, per port and protocol)."""
    gaps = [
        f"udp endpoint {e.host}:{e.port} is not supported: the DNS stub answers udp port "
        f"{DNS_PORT} inside the action's network namespace"
        for e in egress.endpoints
        if e.protocol == "udp" and e.port == DNS_PORT
    ]
    tcp = {e.port for e in egress.endpoints if e.protocol in TCP_PROTOCOLS}
    udp = {e.port for e in egress.endpoints if e.protocol == "udp"}
    most = (MAX_FDS - 3) // 2  # the DNS socket and up to two exported mounts
    if len(tcp) + len(udp) > most:
        gaps.append(
            f"the allowlist names {len(tcp) + len(udp)} distinct (port, protocol) pairs; "
            f"the egress relay carries at most {most}"
        )
    return gaps


async def system_resolve(host: str, port: int) -> list[tuple[str, int]]:
    """The connector's own resolver: getaddrinfo, IPv4 and IPv6, in the order it gives."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found = [
        (str(info[4][0]), int(info[4][1]))
        for info in infos
        if info[0] in (socket.AF_INET, socket.AF_INET6)
    ]
    return list(dict.fromkeys(found))


class RelayBudget:
    """Relayed connections open at once across every relay that shares it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def take(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def give(self) -> None:
        self.open -= 1

    def __repr__(self) -> str:
        return f"<RelayBudget {self.open}/{self.limit} open>"


_process_budget: RelayBudget | None = None


def process_budget(limit: int | None = None) -> RelayBudget:
    """The budget every relay of this process shares; ``limit`` (the config's
    ``egress.max_connections_total``) replaces the one it has."""
    global _process_budget
    if _process_budget is None:
        _process_budget = RelayBudget(limit or EgressConfig().max_connections_total)
    elif limit is not None:
        _process_budget.limit = limit
    return _process_budget


class _Cut(Exception):
    """A cap was reached; the connection ends here."""


class EgressRelay:
    """Relays one action's declared TCP and UDP egress and keeps its network transcript."""

    def __init__(
        self,
        egress: EgressNetwork,
        addresses: SyntheticAddresses,
        *,
        resolve: Resolver | None = None,
        connect_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_open: int | None = None,
        budget: RelayBudget | None = None,
        allow_private_answers: bool = True,
    ) -> None:
        self.egress = egress
        self.addresses = addresses
        self.stub = DnsStub(addresses)
        self._resolve = resolve or system_resolve
        self._allow_private = allow_private_answers
        self._connect_timeout = connect_timeout
        self._clock = clock
        self._max_open = max_open or EgressConfig().max_connections_per_action
        self._budget = budget if budget is not None else process_budget()
        self._open = 0
        self._servers: list[asyncio.Server] = []
        self._conns: list[Conn] = []
        self.datagrams = DatagramRelay(self, connect_timeout=connect_timeout, clock=clock)
        self._active: set[asyncio.Task[None]] = set()
        # Both ends of every allowed connection: a closed one may still be flushing to a
        # peer that never reads, and close() must not leave it behind.
        self._writers: list[asyncio.StreamWriter] = []
        self._refusals: list[str] = []
        self.refused_count = 0
        self.bytes_total = 0
        self._closed = False

    async def start(self, listeners: list[socket.socket], dns_sock: socket.socket) -> None:
        """Serve every listener (TCP) and bound socket (UDP), and the DNS stub; the relay
        owns the sockets from now on."""
        try:
            for sock in listeners:
                if sock.type == socket.SOCK_DGRAM:
                    self.datagrams.start(sock)
                else:
                    self._servers.append(await asyncio.start_server(self._accepted, sock=sock))
            self.stub.start(dns_sock)
        except BaseException:
            await self.close()
            for sock in [*listeners, dns_sock]:
                sock.close()
            raise

    def _match(self, host: str | None, port: int, *, udp: bool) -> Endpoint | None:
        if host is None:
            return None
        for e in self.egress.endpoints:
            if e.host == host and e.port == port and (e.protocol == "udp") == udp:
                return e
        return None

    def _refuse(self, reason: str) -> None:
        self.refused_count += 1
        if len(self._refusals) < REFUSALS_KEPT and reason not in self._refusals:
            self._refusals.append(reason)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._active.add(task)
        try:
            await self._handle(reader, writer)
        except asyncio.CancelledError:
            # close() tore it down. The task must end normally: asyncio (3.11) asks a
            # cancelled client_connected_cb task for its exception and logs a traceback.
            pass
        finally:
            self._active.discard(task)
            if not writer.is_closing():
                writer.transport.abort()  # refused, failed or torn down: reset, flush nothing

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed:
            return
        dst_ip, dst_port = writer.get_extra_info("sockname")[:2]
        conn = self.admit(dst_ip, dst_port, udp=False)
        if conn is None:
            return
        self._writers.append(writer)
        try:
            await self._serve(conn, reader, writer)
        finally:
            conn.ended = self._clock()
            self.release(conn)

    def admit(self, dst_ip: str, dst_port: int, *, udp: bool) -> Conn | None:
        """A new connection (or UDP flow) to where the program wrote, when it is declared
        and within the limits; else None, and the refusal counted."""
        host = self.addresses.host_for(dst_ip)
        endpoint = self._match(host, dst_port, udp=udp)
        if endpoint is None:
            where = f"[{dst_ip}]" if ":" in dst_ip else dst_ip
            shown = where if host is None or host == dst_ip else f"{host} ({dst_ip})"
            self._refuse(f"undeclared destination {shown}:{dst_port}" + (" (udp)" if udp else ""))
            return None
        if len(self._conns) >= MAX_CONNECTIONS:
            self._refuse(f"connection limit ({MAX_CONNECTIONS}) reached for this action")
            return None
        if self._open >= self._max_open:
            self._refuse(
                f"more than {self._max_open} connections open at once "
                "(egress.max_connections_per_action)"
            )
            return None
        if not self._budget.take():
            self._refuse(
                f"the node relays at most {self._budget.limit} connections at once "
                "(egress.max_connections_total)"
            )
            return None
        self._open += 1
        conn = Conn(endpoint, self._clock())
        self._conns.append(conn)
        return conn

    def release(self, conn: Conn) -> None:
        """Give back the slot an admitted connection held."""
        self._open -= 1
        self._budget.give()

    def charge(self, conn: Conn, payload: int, *, outbound: bool) -> str:
        """Count one UDP datagram of ``payload`` bytes, charged ``payload + UDP_HEADER``
        (so an empty datagram is not free), when both caps allow it whole; else count
        nothing and return which cap it would cross."""
        per_conn, total = self.egress.max_bytes_per_connection, self.egress.max_bytes_total
        cost = payload + UDP_HEADER
        conn_left = per_conn - conn.charged
        total_left = total - self.bytes_total
        if cost > min(conn_left, total_left):
            if conn_left <= total_left:
                return f"capped: max_bytes_per_connection ({per_conn}) reached"
            return f"capped: max_bytes_total ({total}) reached"
        if outbound:
            conn.sent += payload
        else:
            conn.received += payload
        conn.charged += cost
        self.bytes_total += cost
        return ""

    async def resolve(self, host: str, port: int) -> list[tuple[str, int]]:
        """The declared endpoint's addresses, as the connector's resolver gives them, less
        those a declared name may not reach (``answers``); raises
        :class:`answers.RefusedAnswer` when that leaves none."""
        found = await self._resolve(host, port)
        return answers.screen(host, found, allow_private=self._allow_private)

    async def _serve(
        self, conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        target = f"{conn.endpoint.host}:{conn.endpoint.port}"
        if self.bytes_total >= self.egress.max_bytes_total:
            conn.note = f"capped: max_bytes_total ({self.egress.max_bytes_total}) already spent"
            return
        first = b""
        if conn.endpoint.protocol in NAMED_PROTOCOLS:
            checked = await self._check_name(conn, reader)
            if checked is None:
                return
            first = checked
        try:
            up_reader, up_writer = await self._connect(conn.endpoint)
        except answers.RefusedAnswer as exc:
            conn.note = str(exc)
            return
        except TimeoutError:
            conn.note = f"connect to {target} failed: no answer within {self._connect_timeout} s"
            return
        except OSError as exc:
            conn.note = f"connect to {target} failed: {exc}"
            return
        self._writers.append(up_writer)
        pumps = [
            asyncio.create_task(self._pump(conn, reader, up_writer, outbound=True, first=first)),
            asyncio.create_task(self._pump(conn, up_reader, writer, outbound=False)),
        ]
        clean = False
        try:
            done, _pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                err = t.exception()
                if isinstance(err, OSError) and not conn.note:
                    conn.note = f"connection to {target} broke: {err}"
            clean = all(t.exception() is None or isinstance(t.exception(), _Cut) for t in done)
        finally:
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                # close() flushes what was forwarded up to a cap; abort() when torn down.
                if clean:
                    w.close()
                else:
                    w.transport.abort()

    async def _check_name(self, conn: Conn, reader: asyncio.StreamReader) -> bytes | None:
        """The connection's first bytes, once they name the declared host; else None
        (and why, in the connection's note)."""
        e, data = conn.endpoint, b""
        what = "Host" if e.protocol == "http" else "TLS server name (SNI)"
        while True:
            try:
                named = sniff.first_name(e.protocol, data)
            except sniff.Unreadable as exc:
                conn.note = f"refused: {exc} ({e.protocol} endpoints are checked for {what})"
                return None
            if named is not None:
                break
            chunk = await reader.read(CHUNK)
            if not chunk:
                conn.note = f"closed before its {what} was complete"
                return None
            data += chunk
        if not sniff.matches(named, e.host, e.port):
            shown = "none" if named.host is None else repr(named.host)
            shown += f" port {named.port}" if named.port is not None else ""
            conn.note = f"refused: {what} {shown} is not the declared {e.host}:{e.port}"
            return None
        return data

    async def _connect(
        self, endpoint: Endpoint
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        errors: list[str] = []
        async with asyncio.timeout(self._connect_timeout):
            for ip, port in await self.resolve(endpoint.host, endpoint.port):
                try:
                    return await asyncio.open_connection(ip, port, limit=CHUNK)
                except OSError as exc:
                    errors.append(f"{ip}:{port}: {exc.strerror or exc}")
        raise OSError(f"no address answered ({'; '.join(errors) or 'name resolved to nothing'})")

    async def _pump(
        self,
        conn: Conn,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        outbound: bool,
        first: bytes = b"",
    ) -> None:
        per_conn = self.egress.max_bytes_per_connection
        total = self.egress.max_bytes_total
        while True:
            chunk, first = first or await reader.read(CHUNK), b""
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            conn_left = per_conn - conn.charged
            total_left = total - self.bytes_total
            cut = ""
            if len(chunk) > min(conn_left, total_left):
                chunk = chunk[: max(min(conn_left, total_left), 0)]
                if conn_left <= total_left:
                    cut = f"capped: max_bytes_per_connection ({per_conn}) reached"
                else:
                    cut = f"capped: max_bytes_total ({total}) reached"
            if outbound:
                conn.sent += len(chunk)
            else:
                conn.received += len(chunk)
            conn.charged += len(chunk)
            self.bytes_total += len(chunk)
            if chunk:
                writer.write(chunk)
            if cut:
                conn.note = cut
                raise _Cut(cut)
            await writer.drain()

    def transcript(self) -> list[TranscriptRow]:
        """One row per allowed connection or UDP flow, in admission order (in-flight ones
        timed to now; a UDP flow from its first datagram to its last)."""
        now = self._clock()
        return [
            TranscriptRow(
                host=c.endpoint.host,
                port=c.endpoint.port,
                protocol=c.endpoint.protocol,
                bytes_sent=c.sent,
                bytes_received=c.received,
                duration_ms=max(
                    0, round(((c.ended if c.ended is not None else now) - c.started) * 1000)
                ),
            )
            for c in self._conns
        ]

    @property
    def notes(self) -> list[str]:
        """Parallel to :meth:`transcript`: why a row ended early ("capped: …",
        "connect … failed: …"), or "" for a connection that ended normally."""
        return [c.note for c in self._conns]

    @staticmethod
    def is_violation(note: str) -> bool:
        """A note the action caused (a cap, a refused destination or name): an envelope
        violation. The network's own doing (a reset, a refused or unanswered connect to
        a declared endpoint) is not: the action saw it as any program would."""
        return note.startswith(("capped", "refused", "closed before"))

    def refusals(self) -> list[str]:
        """Distinct reasons connections were refused (first 32); see ``refused_count``."""
        return list(self._refusals)

    def dns_refused(self) -> list[str]:
        """Distinct names the DNS stub refused (first 32)."""
        return list(self.stub.tally.refused_names)

    async def close(self) -> None:
        """Stop listening, tear down relays in flight, close the stub; idempotent, bounded."""
        self._closed = True
        for server in self._servers:
            server.close()
        self.stub.close()
        await self.datagrams.close(CLOSE_GRACE)
        tasks = list(self._active)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_GRACE)
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"serving {len(self._servers)} listeners"
        return (
            f"<EgressRelay {state}, connections={len(self._conns)}, "
            f"open={self._open}/{self._max_open}, refused={self.refused_count}, "
            f"bytes_total={self.bytes_total}/{self.egress.max_bytes_total}, {self.stub!r}, "
            f"{self.datagrams!r}>"
        )
