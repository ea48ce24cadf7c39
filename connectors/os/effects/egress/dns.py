"""The DNS stub: answers declared names with synthetic addresses and never forwards a query.

Each declared host name gets a stable address from 198.18.0.0/15 (the benchmarking
range, never routed); inside the action's namespace every IPv4 address is local, so
a connect to that address reaches the relay, which maps it back to the name. The
stub has no upstream: an undeclared name gets NXDOMAIN and nothing leaves the host.

    >>> from sensorium.shared.wire.declaration import Endpoint
    >>> addrs = SyntheticAddresses([Endpoint(host="Example.org.", port=443, protocol="https")])
    >>> addrs.address_for("example.org"), addrs.host_for("198.18.0.1")
    ('198.18.0.1', 'Example.org.')
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import struct
from collections.abc import Iterable

import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from sensorium.connectors.os.effects.egress.netsetup import IP_PKTINFO
from sensorium.shared.wire.declaration import Endpoint

SYNTHETIC_NET = ipaddress.IPv4Network("198.18.0.0/15")
ANSWER_TTL = 5
REFUSED_NAMES_KEPT = 32
_MAX_QUERY = 4096
_HOSTNAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_-]{1,63})*\.?\Z")
_IN_PKTINFO = "=i4s4s"  # ipi_ifindex, ipi_spec_dst, ipi_addr


def _key(name: str) -> str:
    return name.rstrip(".").lower()


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


class SyntheticAddresses:
    """Declared host ↔ address, both ways: names get synthetic IPv4s in declaration
    order, IP literals map to themselves."""

    def __init__(self, endpoints: Iterable[Endpoint]) -> None:
        self._by_name: dict[str, tuple[str, str]] = {}  # key -> (declared host, address)
        self._by_ip: dict[str, str] = {}  # address -> declared host
        hosts = list(dict.fromkeys(e.host for e in endpoints))
        for host in hosts:
            ip = _literal(host)
            if ip is not None:
                self._by_ip.setdefault(ip, host)
        pool = SYNTHETIC_NET.hosts()
        for host in hosts:
            if _literal(host) is not None or _key(host) in self._by_name:
                continue
            if not _HOSTNAME.match(host):
                raise ValueError(
                    f"egress host {host!r} is neither an IP address nor a DNS name; "
                    "declare letters, digits, '-' and '_' in dot-separated labels "
                    "(punycode for internationalized names)"
                )
            ip = next(str(a) for a in pool if str(a) not in self._by_ip)
            self._by_name[_key(host)] = (host, ip)
            self._by_ip[ip] = host

    def address_for(self, name: str) -> str | None:
        """The address a program is given for ``name``, or None when it is undeclared."""
        literal = _literal(name)
        if literal is not None:
            return literal if literal in self._by_ip else None
        entry = self._by_name.get(_key(name))
        return entry[1] if entry else None

    def host_for(self, ip: str) -> str | None:
        """The declared host (as written) a program reached by connecting to ``ip``."""
        literal = _literal(ip)
        return self._by_ip.get(literal) if literal is not None else None

    def mapping(self) -> dict[str, str]:
        """Declared name → synthetic address, for the action's /etc/hosts."""
        return {host: ip for host, ip in self._by_name.values()}

    def __repr__(self) -> str:
        literals = sorted(self._by_ip.keys() - {ip for _, ip in self._by_name.values()})
        return f"SyntheticAddresses({self.mapping()!r}, literals={literals!r})"


class DnsTally:
    """What the stub did, for the log and the outcome; refused names kept bounded."""

    def __init__(self) -> None:
        self.answered = 0
        self.refused = 0
        self.dropped = 0
        self.refused_names: list[str] = []

    def refuse(self, name: str) -> None:
        self.refused += 1
        if len(self.refused_names) < REFUSED_NAMES_KEPT and name not in self.refused_names:
            self.refused_names.append(name)

    def __repr__(self) -> str:
        return (
            f"DnsTally(answered={self.answered}, refused={self.refused}, "
            f"dropped={self.dropped}, refused_names={self.refused_names!r})"
        )


def answer(
    query_wire: bytes, addresses: SyntheticAddresses, tally: DnsTally | None = None
) -> bytes | None:
    """The reply to one query, or None to drop it (malformed, or not a query).

    Declared name: A → one record with its synthetic address; any other type →
    NOERROR with no answer (so a program falls back to IPv4). Undeclared name →
    NXDOMAIN. Other opcodes, classes or several questions → REFUSED / FORMERR.
    """
    tally = tally if tally is not None else DnsTally()
    try:
        query = dns.message.from_wire(query_wire)
    except (dns.exception.DNSException, ValueError, struct.error):
        tally.dropped += 1
        return None
    if query.flags & dns.flags.QR:
        tally.dropped += 1  # a response sent to us: answering could start a loop
        return None
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA
    response.flags &= ~dns.flags.RA
    if query.opcode() != dns.opcode.QUERY:
        response.set_rcode(dns.rcode.REFUSED)
        tally.refused += 1
        return response.to_wire()
    if len(query.question) != 1:
        response.set_rcode(dns.rcode.FORMERR)
        tally.refused += 1
        return response.to_wire()
    question = query.question[0]
    qname = question.name.to_text(omit_final_dot=True)
    ip = addresses.address_for(qname) if _literal(qname) is None else None
    if question.rdclass != dns.rdataclass.IN:
        response.set_rcode(dns.rcode.REFUSED)
        tally.refuse(qname)
    elif ip is None:
        response.set_rcode(dns.rcode.NXDOMAIN)
        tally.refuse(qname)
    else:
        if question.rdtype == dns.rdatatype.A:
            response.answer.append(
                dns.rrset.from_text(question.name, ANSWER_TTL, dns.rdataclass.IN, "A", ip)
            )
        tally.answered += 1
    return response.to_wire()


class DnsStub:
    """Serves :func:`answer` on a UDP socket bound inside the action's namespace.

    Every address is local in the namespace, so a program with its own resolver
    (8.8.8.8, say) reaches the stub too. Replies go out with ``sendmsg`` and the
    query's destination as IP_PKTINFO, so they leave from the address queried even
    when the program's socket is bound elsewhere; resolvers drop any other source.
    (Not ``create_datagram_endpoint``: its protocol never sees ancillary data.)
    """

    def __init__(self, addresses: SyntheticAddresses) -> None:
        self.addresses = addresses
        self.tally = DnsTally()
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, sock: socket.socket) -> None:
        """Serve ``sock`` on the running loop; the stub owns it from now on."""
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        for _ in range(64):  # bounded per wakeup, so a flood cannot starve the relay
            try:
                data, ancdata, _flags, peer = sock.recvmsg(
                    _MAX_QUERY, socket.CMSG_SPACE(struct.calcsize(_IN_PKTINFO))
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # ICMP errors from earlier replies surface here; nothing to do
            reply = answer(data, self.addresses, self.tally)
            if reply is None:
                continue
            cmsgs = []
            for level, ctype, cdata in ancdata:
                if level == socket.IPPROTO_IP and ctype == IP_PKTINFO:
                    _ifindex, _spec, dst = struct.unpack(_IN_PKTINFO, cdata[:12])
                    info = struct.pack(_IN_PKTINFO, 0, dst, b"\0\0\0\0")
                    cmsgs.append((socket.IPPROTO_IP, IP_PKTINFO, info))
            try:
                sock.sendmsg([reply], cmsgs, 0, peer)
            except OSError:
                pass  # a full buffer or a vanished peer: DNS clients retry

    def close(self) -> None:
        """Stop serving and close the socket; idempotent."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(sock.fileno())
        sock.close()

    def __repr__(self) -> str:
        state = "serving" if self._sock is not None else "closed"
        return f"DnsStub({state}, {self.tally!r})"
