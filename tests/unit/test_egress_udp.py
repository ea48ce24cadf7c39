"""C4 over UDP and IPv6: datagram flows and IPv6 destinations through the real relay.

The namespace, the program's side and the echo servers are ``egress_netns``'s; these
add UDP sockets on the namespace side and IPv6 addresses on both. No test waits for
something to happen in time: a reply is awaited (resent at most a few times), an
absence is what a bounded wait finds.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from egress_netns import Netns, allowlist, run, tcp_listener, udp_socket

from sensorium.connectors.os.effects.egress.datagram import (
    MAX_PENDING_BYTES,
    MAX_PENDING_DATAGRAMS,
    UDP_HEADER,
)
from sensorium.connectors.os.effects.egress.relay import EgressRelay
from sensorium.shared.wire.declaration import Endpoint


def _host_ipv6() -> None:
    """IPv6 tests need ``::1`` on the host (and so in a fresh namespace)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"this host has no IPv6 loopback: {exc}")


def _rows(relay: EgressRelay) -> list[tuple[str, int, str, int, int]]:
    return [
        (r.host, r.port, r.protocol, r.bytes_sent, r.bytes_received) for r in relay.transcript()
    ]


def test_udp_datagrams_to_a_declared_endpoint_are_relayed_both_ways() -> None:
    echo = udp_socket()
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="127.0.0.1", port=port, protocol="udp")])
    got: dict[str, object] = {}

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        got.update(await ns.ask("udp", ip="127.0.0.1", port=port, size=10, count=3))

    relay = run(egress, [echo], scenario)
    assert got["replies"] == 3
    # The replies come from the address the program wrote to, as a real peer's would.
    assert got["sources"] == ["127.0.0.1"] * 3
    sent, received = got["sent"], got["received"]
    assert _rows(relay) == [("127.0.0.1", port, "udp", sent, received)]
    assert relay.notes == [""] and relay.refused_count == 0


def test_a_declared_udp_name_is_reached_through_its_synthetic_address() -> None:
    # localhost: the one name that may resolve to the loopback these echo servers use.
    echo = udp_socket()
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="localhost", port=123, protocol="udp")])
    asked: list[tuple[str, int]] = []

    async def resolve(host: str, declared: int) -> list[tuple[str, int]]:
        asked.append((host, declared))
        return [("127.0.0.1", port)]

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        [ip] = (await ns.ask("dns", name="localhost"))["answers"]
        reply = await ns.ask("udp", ip=ip, port=123, size=48)
        assert reply["replies"] == 1 and reply["sources"] == [ip]

    relay = run(egress, [echo], scenario, resolve)
    assert asked == [("localhost", 123)]
    [(host, declared, protocol, sent, received)] = _rows(relay)
    assert (host, declared, protocol) == ("localhost", 123, "udp")
    assert sent >= 48 and received == 48


def test_a_udp_name_that_resolves_to_loopback_is_refused_and_stays_cut() -> None:
    """DNS rebinding over UDP: the flow is cut with a note saying why, and its later
    datagrams open no new flow; the same server declared by its literal is reached."""
    echo = udp_socket()
    port = echo.getsockname()[1]
    egress = allowlist(
        [
            Endpoint(host="rebind.example.com", port=port, protocol="udp"),
            Endpoint(host="127.0.0.1", port=port, protocol="udp"),
        ]
    )

    async def resolve(host: str, declared: int) -> list[tuple[str, int]]:
        return [(host if host == "127.0.0.1" else "127.0.0.1", declared)]

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        [ip] = (await ns.ask("dns", name="rebind.example.com"))["answers"]
        refused = await ns.ask("udp", ip=ip, port=port, size=5, count=2, tries=1, wait=0.5)
        assert refused["replies"] == 0
        assert (await ns.ask("udp", ip="127.0.0.1", port=port, size=5))["replies"] == 1

    relay = run(egress, [echo], scenario, resolve)
    assert [row[:2] for row in _rows(relay)] == [("rebind.example.com", port), ("127.0.0.1", port)]
    assert _rows(relay)[0][3:] == (0, 0)
    assert relay.notes[0].startswith(
        "refused: the declared name rebind.example.com resolved to 127.0.0.1 (loopback)"
    )
    assert relay.notes[1] == "" and relay.is_violation(relay.notes[0])


def test_udp_to_an_undeclared_destination_gets_nothing_and_is_refused() -> None:
    echo = udp_socket()
    port = echo.getsockname()[1]
    egress = allowlist(
        [
            Endpoint(host="127.0.0.1", port=port, protocol="udp"),
            Endpoint(host="127.0.0.1", port=port + 1 if port < 65535 else 1, protocol="tcp"),
        ]
    )
    tcp_only = egress.endpoints[1].port

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        # A declared port at another address: the relay drops it and counts a refusal.
        other = await ns.ask("udp", ip="10.9.9.9", port=port, size=5, tries=2, wait=0.5)
        assert other["replies"] == 0 and other["sent"] == 10
        # A port declared for TCP only, or not at all: no socket there, nothing relayed.
        for p in (tcp_only, 9):
            reply = await ns.ask("udp", ip="127.0.0.1", port=p, size=5, tries=1, wait=0.5)
            assert reply["replies"] == 0

    relay = run(egress, [echo], scenario)
    assert relay.transcript() == []
    assert relay.refusals() == [f"undeclared destination 10.9.9.9:{port} (udp)"]
    assert relay.refused_count == 2 and relay.bytes_total == 0


def test_a_datagram_that_would_cross_the_per_flow_cap_cuts_the_flow() -> None:
    echo = udp_socket()
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="127.0.0.1", port=port, protocol="udp")], per=250)

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        first = await ns.ask("udp", ip="127.0.0.1", port=port, size=100, hold=1)
        assert first["replies"] == 1 and first["sent"] == 100
        # 108 + 108 + 108 > 250 (payload and header): dropped whole; the flow stays cut.
        after = await ns.ask("udp", ip="127.0.0.1", port=port, size=100, hold=1, tries=2, wait=0.5)
        assert after["replies"] == 0
        small = await ns.ask("udp", ip="127.0.0.1", port=port, size=1, tries=1, wait=0.5, hold=1)
        assert small["replies"] == 0
        # Another socket is another flow, with a cap of its own.
        fresh = await ns.ask("udp", ip="127.0.0.1", port=port, size=100)
        assert fresh["replies"] == 1 and fresh["sent"] == 100

    relay = run(egress, [echo], scenario)
    assert _rows(relay) == [
        ("127.0.0.1", port, "udp", 100, 100),
        ("127.0.0.1", port, "udp", 100, 100),
    ]
    assert relay.notes == ["capped: max_bytes_per_connection (250) reached", ""]
    assert EgressRelay.is_violation(relay.notes[0])


def test_the_total_cap_spans_udp_flows_and_cuts_a_reply() -> None:
    echo = udp_socket()
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="127.0.0.1", port=port, protocol="udp")], total=324)

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        assert (await ns.ask("udp", ip="127.0.0.1", port=port, size=100))["replies"] == 1
        # 216 charged (each datagram 100 + an 8-byte header): the next datagram fits
        # (324), its echo would not.
        late = await ns.ask("udp", ip="127.0.0.1", port=port, size=100, tries=1, wait=1.0)
        assert late["replies"] == 0

    relay = run(egress, [echo], scenario)
    assert _rows(relay) == [
        ("127.0.0.1", port, "udp", 100, 100),
        ("127.0.0.1", port, "udp", 100, 0),
    ]
    assert relay.notes == ["", "capped: max_bytes_total (324) reached"]
    assert relay.bytes_total == 324


def _sink() -> socket.socket:
    """A host-side UDP peer that answers nothing; the test reads what reaches it."""
    s = udp_socket()
    s.setblocking(False)
    return s


async def _received_until(sink: socket.socket, marker: bytes) -> list[bytes]:
    """What reaches ``sink``, in order, up to and including ``marker``."""
    loop = asyncio.get_running_loop()
    got: list[bytes] = []
    for _ in range(10_000):
        data = await asyncio.wait_for(loop.sock_recv(sink, 65536), 5.0)
        got.append(data)
        if data == marker:
            return got
    raise AssertionError(f"{marker!r} never came in {len(got)} datagrams")


def test_empty_datagrams_are_charged_and_cut_the_flow_at_the_cap() -> None:
    """An empty datagram costs its header: a flood of them hits the cap like any bytes."""
    sink = _sink()
    port = sink.getsockname()[1]
    per = (1 + UDP_HEADER) + 40 * UDP_HEADER  # one byte first, then room for 40 empty
    egress = allowlist([Endpoint(host="127.0.0.1", port=port, protocol="udp")], per=per)
    got: list[bytes] = []

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        udp = {"ip": "127.0.0.1", "port": port, "burst": True}
        # The first byte opens the flow's host side, so the burst is relayed as it is read.
        await ns.ask("udp", **udp, size=1, fill="a", hold=1)
        assert await _received_until(sink, b"a") == [b"a"]
        await ns.ask("udp", **udp, size=0, count=100, hold=1)
        # Another flow's datagram, behind the burst on the same socket: once it is
        # through, the relay has read every one of the burst's.
        await ns.ask("udp", **udp, size=1, fill="m")
        got.extend(await _received_until(sink, b"m"))

    try:
        relay = run(egress, [], scenario)
    finally:
        sink.close()
    assert got == [b""] * 40 + [b"m"]
    assert _rows(relay) == [("127.0.0.1", port, "udp", 1, 0), ("127.0.0.1", port, "udp", 1, 0)]
    assert relay.notes == [f"capped: max_bytes_per_connection ({per}) reached", ""]
    assert relay.bytes_total == per + 1 + UDP_HEADER


def test_datagrams_held_while_the_endpoint_resolves_are_bounded() -> None:
    """Held datagrams are bounded by count and by charged bytes; the rest drop."""
    sink = _sink()
    port = sink.getsockname()[1]
    egress = allowlist(
        [
            Endpoint(host="localhost", port=port, protocol="udp"),
            Endpoint(host="127.0.0.1", port=port, protocol="udp"),
        ]
    )
    big = 8000
    fit = MAX_PENDING_BYTES // (big + UDP_HEADER)  # big ones held before the bytes bound
    assert 0 < fit < 10 and fit + 80 > MAX_PENDING_DATAGRAMS
    gate: list[asyncio.Event] = []
    got: list[bytes] = []

    async def resolve(host: str, declared: int) -> list[tuple[str, int]]:
        if host == "localhost":
            await gate[0].wait()
        return [("127.0.0.1", port)]

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        gate.append(asyncio.Event())
        [ip] = (await ns.ask("dns", name="localhost"))["answers"]
        udp = {"ip": ip, "port": port, "burst": True, "hold": 1}
        await ns.ask("udp", **udp, size=big, count=10)
        await ns.ask("udp", **udp, size=0, count=80)
        # Behind them on the same socket, to a literal that resolves at once: once it is
        # through, every datagram of the held flow has been read (and held or dropped).
        await ns.ask("udp", ip="127.0.0.1", port=port, burst=True, size=1, fill="m")
        assert await _received_until(sink, b"m") == [b"m"]
        gate[0].set()
        # The held ones go out in one step once the endpoint resolved; then one more.
        loop = asyncio.get_running_loop()
        got.append(await asyncio.wait_for(loop.sock_recv(sink, 65536), 5.0))
        await ns.ask("udp", **udp, size=1, fill="z")
        got.extend(await _received_until(sink, b"z"))

    try:
        relay = run(egress, [], scenario, resolve, connect_timeout=60.0)
    finally:
        sink.close()
    held = MAX_PENDING_DATAGRAMS - fit
    assert got == [b"x" * big] * fit + [b""] * held + [b"z"]
    rows = _rows(relay)
    assert rows[0] == ("localhost", port, "udp", fit * big + 1, 0)
    assert relay.notes == ["", ""]


def test_ipv6_tcp_to_a_declared_literal_is_relayed_and_the_rest_refused() -> None:
    _host_ipv6()
    echo = tcp_listener("::1")
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="::1", port=port, protocol="tcp")])

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        assert await ns.ask("tcp", ip="::1", port=port, send=2000) == {
            "received": 2000,
            "error": None,
        }
        # Every IPv6 address is local in the namespace too: an undeclared one on the
        # declared port reaches the relay, which closes it at once.
        assert (await ns.ask("tcp", ip="fd00::9", port=port, send=5))["received"] == 0
        assert await ns.ask("tcp", ip="::1", port=9, send=1) == {"error": "ConnectionRefusedError"}

    relay = run(egress, [echo], scenario)
    assert _rows(relay) == [("::1", port, "tcp", 2000, 2000)]
    assert relay.refusals() == [f"undeclared destination [fd00::9]:{port}"]


def test_ipv6_udp_to_a_declared_literal_is_relayed() -> None:
    _host_ipv6()
    echo = udp_socket("::1")
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="::1", port=port, protocol="udp")])

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        reply = await ns.ask("udp", ip="::1", port=port, size=20, count=2)
        assert reply["replies"] == 2 and reply["sources"] == ["::1", "::1"]
        # The IPv4 loopback is not the declared IPv6 one.
        other = await ns.ask("udp", ip="127.0.0.1", port=port, size=5, tries=1, wait=0.5)
        assert other["replies"] == 0

    relay = run(egress, [echo], scenario)
    [(host, declared, protocol, sent, received)] = _rows(relay)
    assert (host, declared, protocol, received) == ("::1", port, "udp", 40)
    assert sent >= 40
    assert relay.refusals() == [f"undeclared destination 127.0.0.1:{port} (udp)"]


def test_a_name_the_connector_resolves_to_ipv6_only_is_reached() -> None:
    """The program asks by name (IPv4 inside); the host side connects over IPv6."""
    _host_ipv6()
    echo = tcp_listener("::1")
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="localhost", port=443, protocol="tcp")])

    async def resolve(host: str, declared: int) -> list[tuple[str, int]]:
        return [("::1", port)]

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        [ip] = (await ns.ask("dns", name="localhost"))["answers"]
        assert await ns.ask("tcp", ip=ip, port=443, send=9) == {"received": 9, "error": None}

    relay = run(egress, [echo], scenario, resolve)
    assert _rows(relay) == [("localhost", 443, "tcp", 9, 9)]


def test_a_namespace_without_ipv6_still_relays_ipv4() -> None:
    """Where new namespaces get disable_ipv6, the IPv6 route is refused: the action is
    IPv4 only (its IPv6 connects fail as on any such host), never without a network."""
    echo = tcp_listener()
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="127.0.0.1", port=port, protocol="tcp")])

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        assert ns.ipv6 is False
        assert all(s.family == socket.AF_INET for s in ns.listeners)
        assert await ns.ask("tcp", ip="127.0.0.1", port=port, send=10) == {
            "received": 10,
            "error": None,
        }
        assert "error" in await ns.ask("tcp", ip="::1", port=port, send=1)

    relay = run(egress, [echo], scenario, ipv6_off=True)
    assert _rows(relay) == [("127.0.0.1", port, "tcp", 10, 10)]
