"""Which resolved addresses a declared name may be connected to (against DNS rebinding).

A declared name is resolved on the host for each new connection or UDP flow, so
whoever answers for it chooses where the relay connects. An answer that is loopback,
link-local, unspecified ("this network", 0.0.0.0/8 and ``::``) or multicast, or the
IPv4-mapped form of one, would reach the host's own services (or its neighbours') on
the declared port: it is refused. A declared IP literal is connected as declared (the
operator named that address), and so is the name ``localhost``, whose answer is
loopback by definition (RFC 6761) and which operators declare to mean the host's own
services. Private answers (RFC 1918, IPv6 unique-local) are allowed unless
``egress.allow_private_answers`` is false: many operators declare internal hosts by
name.
"""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")  # connects to the host itself on Linux
_PRIVATE = (
    ipaddress.IPv4Network("10.0.0.0/8"),
    ipaddress.IPv4Network("172.16.0.0/12"),
    ipaddress.IPv4Network("192.168.0.0/16"),
    ipaddress.IPv6Network("fc00::/7"),
)


class RefusedAnswer(Exception):
    """Every address a declared name resolved to is one it may not reach."""


def screened(host: str) -> bool:
    """Whether the addresses ``host`` resolves to are screened: a name, not a literal
    and not ``localhost``."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host.rstrip(".").lower() != "localhost"
    return False


def why_refused(ip: str, *, allow_private: bool = True) -> str | None:
    """Why a declared name may not be connected to ``ip``, or None when it may."""
    try:
        addr: Address = ipaddress.ip_address(ip)
    except ValueError:
        return "not an IP address"
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback:
        return "loopback"
    if addr.is_link_local:
        return "link-local"
    if addr.is_unspecified or addr in _THIS_NETWORK:
        return "unspecified"
    if addr.is_multicast:
        return "multicast"
    if not allow_private and any(addr in net for net in _PRIVATE):
        return "private, and egress.allow_private_answers is false"
    return None


def screen(
    host: str, answers: list[tuple[str, int]], *, allow_private: bool = True
) -> list[tuple[str, int]]:
    """The answers for declared ``host`` the relay may connect to; raises
    :class:`RefusedAnswer` (saying why) when there were some and none is."""
    if not screened(host):
        return answers
    kept: list[tuple[str, int]] = []
    refused: list[str] = []
    for ip, port in answers:
        why = why_refused(ip, allow_private=allow_private)
        if why is None:
            kept.append((ip, port))
        else:
            refused.append(f"{ip} ({why})")
    if refused and not kept:
        raise RefusedAnswer(
            f"refused: the declared name {host} resolved to {', '.join(refused)}, which a "
            "declared name may not reach; declare the address itself to mean it"
        )
    return kept
