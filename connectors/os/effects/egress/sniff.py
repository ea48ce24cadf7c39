"""The name a connection asks for: an HTTP request's Host, a TLS ClientHello's SNI.

For an endpoint declared ``http`` or ``https`` the relay reads the first bytes the
program sends, before it connects anywhere, and relays only a connection that names
the declared host: otherwise one declared address would carry requests for any
site it serves (a CDN, a shared front end). Only the start of each connection is
read — the first HTTP request's head, the ClientHello — and nothing is changed or
kept. What cannot be checked is refused: HTTP/2 with prior knowledge, ``CONNECT``, a
missing, repeated or folded Host, a ClientHello with no or several names, or with
an encrypted inner one (ECH).

Each parser returns ``None`` while it needs more bytes, a :class:`Named`, or raises
:class:`Unreadable` with the reason.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

MAX_HEAD_BYTES = 16 * 1024  # an HTTP request head, or a ClientHello's records
_TLS_HANDSHAKE = 22
_CLIENT_HELLO = 1
_EXT_SERVER_NAME = 0
_EXT_ECH = 0xFE0D
_MAX_METHOD = 32
_METHOD = re.compile(rb"[A-Za-z][A-Za-z0-9_-]*|")  # empty: nothing read yet


class Unreadable(Exception):
    """The start of the connection cannot be checked; the connection is refused."""


@dataclass(frozen=True)
class Named:
    """``host`` as the program named it (lower case, no trailing dot; ``None``: no
    name, as TLS to an IP address sends none); ``port`` only when it named one."""

    host: str | None
    port: int | None = None


def normalize(host: str) -> str:
    return host.lower().rstrip(".")


def matches(named: Named, host: str, port: int) -> bool:
    """Does the name the program sent mean the declared ``host:port``? No name passes
    only for a declared IP address (TLS sends no SNI for one)."""
    if named.port is not None and named.port != port:
        return False
    if named.host is None:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return False
        return True
    return named.host == normalize(host)


def _authority(value: str) -> Named:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; userinfo is refused."""
    if not value or "@" in value or any(c in value for c in " \t/\\"):
        raise Unreadable(f"the authority {value[:100]!r} is not a host[:port]")
    if value.startswith("["):
        close = value.find("]")
        host, rest = value[1:close], value[close + 1 :]
        if close < 0 or (rest and not rest.startswith(":")):
            raise Unreadable(f"the authority {value[:100]!r} is not a host[:port]")
        port = rest[1:] if rest else None
    else:
        host, sep, port_text = value.partition(":")
        port = port_text if sep else None
    if port is not None and (not port.isdigit() or not 0 < int(port) < 65536):
        raise Unreadable(f"the authority {value[:100]!r} has no valid port")
    if not host:
        raise Unreadable(f"the authority {value[:100]!r} names no host")
    return Named(normalize(host), int(port) if port is not None else None)


def http_host(data: bytes) -> Named | None:
    """The first request's Host (and its absolute-form target's, which must agree)."""
    opening = data[: _MAX_METHOD + 1]
    if not _METHOD.fullmatch(opening.partition(b" ")[0]) or (
        b" " not in opening and len(data) > _MAX_METHOD
    ):
        raise Unreadable("the connection does not start with an HTTP/1 request line")
    end = min((i for i in (data.find(b"\r\n\r\n"), data.find(b"\n\n")) if i >= 0), default=-1)
    if end < 0:
        if len(data) >= MAX_HEAD_BYTES:
            raise Unreadable(f"no end of the request head within {MAX_HEAD_BYTES} bytes")
        if data.startswith(b"PRI * HTTP/2"):
            raise Unreadable("HTTP/2 with prior knowledge: its :authority cannot be checked")
        return None
    lines = data[:end].decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise Unreadable("the connection does not start with an HTTP/1 request line")
    method, target, version = parts
    if version.startswith("HTTP/2"):
        raise Unreadable("HTTP/2 with prior knowledge: its :authority cannot be checked")
    if method.upper() == "CONNECT":
        raise Unreadable("CONNECT tunnels elsewhere")
    hosts = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            raise Unreadable("a folded header line (obsolete line folding)")
        name, sep, value = line.partition(":")
        if not sep or name != name.strip():
            raise Unreadable(f"a malformed header line {line[:100]!r}")
        if name.lower() == "host":
            hosts.append(value.strip(" \t"))
    if len(hosts) != 1:
        raise Unreadable("no Host header" if not hosts else "more than one Host header")
    named = _authority(hosts[0])
    lowered = target.lower()
    if lowered.startswith(("http://", "https://")):
        authority = target.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
        other = _authority(authority)
        ports_differ = None not in (other.port, named.port) and other.port != named.port
        if other.host != named.host or ports_differ:
            raise Unreadable(f"the request target {target[:100]!r} names another host")
    elif "://" in lowered:
        raise Unreadable(f"the request target {target[:100]!r} is not this server's")
    return named


def _u(data: bytes, at: int, size: int) -> int:
    if at + size > len(data):
        raise Unreadable("a truncated ClientHello")
    return int.from_bytes(data[at : at + size], "big")


def _handshake(data: bytes) -> bytes | None:
    """The first handshake message, reassembled from the records that carry it."""
    body, at = b"", 0
    while True:
        if len(data) < at + 5:
            return None
        if data[at] != _TLS_HANDSHAKE or data[at + 1] != 3:
            raise Unreadable("the connection does not start with a TLS handshake")
        size = _u(data, at + 3, 2)
        if len(data) < at + 5 + size:
            return None
        body += data[at + 5 : at + 5 + size]
        at += 5 + size
        if len(body) >= 4 and len(body) >= 4 + _u(body, 1, 3):
            return body[: 4 + _u(body, 1, 3)]


def tls_server_name(data: bytes) -> Named | None:
    """The server_name of the ClientHello the connection starts with."""
    hello = _handshake(data)
    if hello is None:
        if len(data) >= MAX_HEAD_BYTES:
            raise Unreadable(f"no complete ClientHello within {MAX_HEAD_BYTES} bytes")
        return None
    if hello[0] != _CLIENT_HELLO:
        raise Unreadable("the first TLS handshake message is not a ClientHello")
    at = 4 + 2 + 32  # type, length, version, random
    at += 1 + _u(hello, at, 1)  # session id
    at += 2 + _u(hello, at, 2)  # cipher suites
    at += 1 + _u(hello, at, 1)  # compression methods
    if at == len(hello):
        return Named(None)  # no extensions at all
    end = at + 2 + _u(hello, at, 2)
    at += 2
    names: list[str] = []
    while at < end:
        kind, size = _u(hello, at, 2), _u(hello, at + 2, 2)
        ext = hello[at + 4 : at + 4 + size]
        if len(ext) != size:
            raise Unreadable("a truncated ClientHello")
        if kind == _EXT_ECH:
            raise Unreadable("an encrypted ClientHello (ECH) hides the server name")
        if kind == _EXT_SERVER_NAME:
            pos, stop = 2, 2 + _u(ext, 0, 2)
            while pos < stop:
                name_type, length = _u(ext, pos, 1), _u(ext, pos + 1, 2)
                if name_type == 0:
                    names.append(ext[pos + 3 : pos + 3 + length].decode("ascii", "replace"))
                pos += 3 + length
        at += 4 + size
    if len(names) > 1:
        raise Unreadable("a ClientHello with more than one server name")
    return Named(normalize(names[0])) if names else Named(None)


def first_name(protocol: str, data: bytes) -> Named | None:
    """The name ``data`` (the first bytes of an ``http``/``https`` connection) asks for."""
    return http_host(data) if protocol == "http" else tls_server_name(data)
