"""Inside an action's fresh network namespace: loopback up, every IPv4 address local, sockets.

These calls run in the forked, single-threaded child that owns the new namespace
(before it execs the action), so they are plain syscalls: no asyncio, no threads.
With ``local 0.0.0.0/0 dev lo`` in the local table, a connect to any IPv4 address
lands on loopback, and a listener bound to ``0.0.0.0:<port>`` accepts it; the
connector, holding that listener's fd outside the namespace, reads the intended
destination with ``getsockname()`` on the accepted socket.

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


def route_all_local() -> None:
    """Add ``local 0.0.0.0/0 dev lo table local`` (as ``ip route add local default dev lo
    table local`` would), so every IPv4 destination is delivered on loopback."""
    oif = socket.if_nametoindex("lo")
    attr = struct.pack(_RTATTR, 8, RTA_OIF) + struct.pack("=I", oif)
    rtm = struct.pack(
        _RTMSG, socket.AF_INET, 0, 0, 0, RT_TABLE_LOCAL, RTPROT_BOOT, RT_SCOPE_HOST, RTN_LOCAL, 0
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
        _read_ack(nl, seq)


def _read_ack(nl: socket.socket, seq: int) -> None:
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
                        "cannot add 'local 0.0.0.0/0 dev lo table local' in the action's "
                        f"network namespace: {os.strerror(-err)}",
                    )
                return
            offset += (length + 3) & ~3


def open_listeners(ports: Sequence[int]) -> list[socket.socket]:
    """One TCP listener on ``0.0.0.0:<port>`` per distinct port, in the order given."""
    listeners: list[socket.socket] = []
    try:
        for port in dict.fromkeys(ports):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot listen on 0.0.0.0:{port} for egress: {exc.strerror}"
                ) from exc
            s.listen(LISTEN_BACKLOG)
    except BaseException:
        for s in listeners:
            s.close()
        raise
    return listeners


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
