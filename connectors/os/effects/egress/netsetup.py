"""Inside an action's fresh network namespace: loopback up, every address local, sockets.

These calls run in the forked, single-threaded child that owns the new namespace
(before it execs the action), so they are plain syscalls: no asyncio, no threads.
With ``local 0.0.0.0/0 dev lo`` (and ``local ::/0 dev lo``) in the local table, a
connect to any IPv4 (IPv6) address lands on loopback, and a listener bound to
``0.0.0.0:<port>`` (``[::]:<port>``) accepts it; the connector, holding that
listener's fd outside the namespace, reads the intended destination with
``getsockname()`` on the accepted socket. A UDP socket bound the same way receives
every datagram sent to its port, whatever the address, and IP_PKTINFO /
IPV6_PKTINFO name the address each one was sent to.

IPv6 is set up when the namespace has it; without it (a kernel booted
``ipv6.disable=1``, or ``disable_ipv6`` set for new namespaces) the namespace is IPv4
only and a program's IPv6 connect fails as on any such host.

    >>> resolv_conf().splitlines()[0]
    b'nameserver 127.0.0.1'
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
from collections.abc import Mapping, Sequence

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
# struct ifreq is 40 bytes on 64-bit Linux: 16-byte name, then a union (flags: short).
_IFREQ = "16sh22x"

# <linux/netlink.h>, <linux/rtnetlink.h>
RTM_NEWROUTE = 24
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
RT_TABLE_LOCAL = 255
RTPROT_BOOT = 3
RT_SCOPE_HOST = 254
RTN_LOCAL = 2
RTA_OIF = 4
_NLMSGHDR = "=IHHII"  # len, type, flags, seq, pid
_RTMSG = "=BBBBBBBBI"  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTATTR = "=HH"  # len, type

# <linux/in.h>; the socket module of Python 3.11 does not export it.
IP_PKTINFO = 8
LISTEN_BACKLOG = 64
DNS_PORT = 53


def loopback_up() -> None:
    """Set IFF_UP on ``lo``; a fresh namespace starts with it down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
            flags = struct.unpack(_IFREQ, req)[1]
            fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot bring loopback up in the action's network namespace: {exc.strerror}"
                " (needs CAP_NET_ADMIN in that namespace)",
            ) from exc


def ipv6_available() -> bool:
    """Can this namespace have IPv6 at all (not a kernel booted without it)?"""
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()
    except OSError:
        return False
    return True


def route_all_local() -> bool:
    """Add ``local 0.0.0.0/0 dev lo table local`` (as ``ip route add local default dev lo
    table local`` would), so every IPv4 destination is delivered on loopback; and
    ``local ::/0`` likewise for IPv6. True when IPv6 is routed too (the namespace has
    it; a refused IPv6 route leaves the action IPv4 only, never without a network)."""
    _add_local_default(socket.AF_INET)
    if not ipv6_available():
        return False
    try:
        _add_local_default(socket.AF_INET6)
    except OSError:
        return False  # "IPv6 is disabled on nexthop device"
    return True


def _add_local_default(family: int) -> None:
    oif = socket.if_nametoindex("lo")
    attr = struct.pack(_RTATTR, 8, RTA_OIF) + struct.pack("=I", oif)
    rtm = struct.pack(
        _RTMSG, family, 0, 0, 0, RT_TABLE_LOCAL, RTPROT_BOOT, RT_SCOPE_HOST, RTN_LOCAL, 0
    )
    body = rtm + attr
    seq = 1
    flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK
    header = struct.pack(
        _NLMSGHDR, struct.calcsize(_NLMSGHDR) + len(body), RTM_NEWROUTE, flags, seq, 0
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as nl:
        nl.bind((0, 0))
        nl.sendto(header + body, (0, 0))
        _read_ack(nl, seq, "0.0.0.0/0" if family == socket.AF_INET else "::/0")


def _read_ack(nl: socket.socket, seq: int, prefix: str) -> None:
    hdr_len = struct.calcsize(_NLMSGHDR)
    nl.settimeout(5.0)
    while True:
        data = nl.recv(65536)
        offset = 0
        while offset + hdr_len <= len(data):
            length, mtype, _flags, mseq, _pid = struct.unpack_from(_NLMSGHDR, data, offset)
            if length < hdr_len:
                raise OSError(
                    errno.EPROTO, "malformed rtnetlink reply while adding the local route"
                )
            if mseq == seq and mtype == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", data, offset + hdr_len)
                if err != 0:
                    raise OSError(
                        -err,
                        f"cannot add 'local {prefix} dev lo table local' in the action's "
                        f"network namespace: {os.strerror(-err)}",
                    )
                return
            offset += (length + 3) & ~3


def open_listeners(
    tcp_ports: Sequence[int], udp_ports: Sequence[int] = (), *, ipv6: bool = True
) -> list[socket.socket]:
    """Per distinct TCP port a listener on ``0.0.0.0:<port>`` and one on ``[::]:<port>``,
    then per distinct UDP port a socket bound likewise (IPv6 ones only with ``ipv6``,
    what :func:`route_all_local` said). The relay tells them apart by family and type."""
    families = [socket.AF_INET, *([socket.AF_INET6] if ipv6 else [])]
    wanted = [(socket.SOCK_STREAM, p) for p in dict.fromkeys(tcp_ports)]
    wanted += [(socket.SOCK_DGRAM, p) for p in dict.fromkeys(udp_ports)]
    opened: list[socket.socket] = []
    try:
        for kind, port in wanted:
            for family in families:
                opened.append(_bound(family, kind, port))
    except BaseException:
        for s in opened:
            s.close()
        raise
    return opened


def _bound(family: int, kind: int, port: int) -> socket.socket:
    s = socket.socket(family, kind)
    try:
        any_addr = "0.0.0.0" if family == socket.AF_INET else "::"
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # IPv4 has its own
        if kind == socket.SOCK_STREAM:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        elif family == socket.AF_INET:
            s.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        else:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
        try:
            s.bind((any_addr, port))
        except OSError as exc:
            proto = "tcp" if kind == socket.SOCK_STREAM else "udp"
            raise OSError(
                exc.errno, f"cannot bind {proto} {any_addr} port {port} for egress: {exc.strerror}"
            ) from exc
        if kind == socket.SOCK_STREAM:
            s.listen(LISTEN_BACKLOG)
    except BaseException:
        s.close()
        raise
    return s


def open_dns() -> socket.socket:
    """The DNS stub's UDP socket on ``0.0.0.0:53``; IP_PKTINFO lets it answer from the
    address the program queried, whichever that was."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        s.bind(("0.0.0.0", DNS_PORT))
    except OSError as exc:
        s.close()
        raise OSError(exc.errno, f"cannot bind the DNS stub on 0.0.0.0:53: {exc.strerror}") from exc
    return s


def resolv_conf() -> bytes:
    """A resolv.conf that sends every lookup to the stub and gives up fast."""
    return b"nameserver 127.0.0.1\noptions attempts:1 timeout:1\n"


def hosts_file(mapping: Mapping[str, str]) -> bytes:
    """An /etc/hosts with the declared names on their synthetic addresses.

    A declared ``localhost`` keeps its synthetic address (it means the host's, reached
    through the relay), so the loopback line is written only when it is not declared.
    """
    lines = [f"{ip}\t{name}" for name, ip in mapping.items()]
    if "localhost" not in {name.lower().rstrip(".") for name in mapping}:
        lines.insert(0, "127.0.0.1\tlocalhost")
    return ("\n".join(lines) + "\n").encode("ascii")
