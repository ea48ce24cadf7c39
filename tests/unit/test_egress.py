"""C4 egress: netns setup, the DNS stub and the byte-capped relay, against the real kernel.

The namespace and the program's side in it are ``egress_netns``'s (shared with the
UDP and IPv6 tests); this process runs the relay and echo servers on the host's
loopback.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import dns.flags
import dns.message
import dns.opcode
import dns.query
import dns.rcode
import dns.rdatatype
import pytest
from egress_netns import Netns, allowlist, free_port, run, tcp_listener

from sensorium.connectors.os.effects.egress import answers, netsetup
from sensorium.connectors.os.effects.egress.dns import DnsStub, DnsTally, SyntheticAddresses, answer
from sensorium.connectors.os.effects.egress.relay import EgressRelay, unsupported_endpoints
from sensorium.shared.config import EgressConfig
from sensorium.shared.wire.declaration import Endpoint

# --- pure parts -------------------------------------------------------------------------


def test_synthetic_addresses_are_stable_and_case_insensitive() -> None:
    addrs = SyntheticAddresses(
        [
            Endpoint(host="API.example.org.", port=443, protocol="https"),
            Endpoint(host="10.1.2.3", port=80, protocol="http"),
            Endpoint(host="api.example.org", port=80, protocol="http"),
            Endpoint(host="db.internal", port=5432, protocol="tcp"),
        ]
    )
    assert addrs.address_for("api.EXAMPLE.org") == "198.18.0.1"
    assert addrs.address_for("db.internal.") == "198.18.0.2"
    assert addrs.address_for("10.1.2.3") == "10.1.2.3"
    assert addrs.address_for("other.org") is None
    assert addrs.host_for("198.18.0.1") == "API.example.org."
    assert addrs.host_for("10.1.2.3") == "10.1.2.3"
    assert addrs.host_for("10.9.9.9") is None
    assert addrs.mapping() == {"API.example.org.": "198.18.0.1", "db.internal": "198.18.0.2"}
    assert "198.18.0.1" in repr(addrs)


def test_a_host_that_is_no_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="neither an IP address nor a DNS name"):
        SyntheticAddresses([Endpoint(host="a b\n1.2.3.4 evil", port=1, protocol="tcp")])


def test_answers_only_declared_names() -> None:
    addrs = SyntheticAddresses([Endpoint(host="api.example.org", port=443, protocol="https")])
    tally = DnsTally()

    def ask(name: str, qtype: str = "A") -> dns.message.Message:
        wire = answer(dns.message.make_query(name, qtype).to_wire(), addrs, tally)
        assert wire is not None
        return dns.message.from_wire(wire)

    r = ask("Api.Example.Org")
    assert r.rcode() == dns.rcode.NOERROR and r.flags & dns.flags.AA
    assert [(rs.ttl, [rd.address for rd in rs]) for rs in r.answer] == [(5, ["198.18.0.1"])]
    assert str(r.answer[0].name) == "Api.Example.Org."  # the question's case, for 0x20 checks
    aaaa = ask("api.example.org", "AAAA")
    assert aaaa.rcode() == dns.rcode.NOERROR and not aaaa.answer
    assert ask("evil.example.net").rcode() == dns.rcode.NXDOMAIN
    notify = dns.message.make_query("api.example.org", "SOA")
    notify.set_opcode(dns.opcode.NOTIFY)
    wire = answer(notify.to_wire(), addrs, tally)
    assert wire is not None and dns.message.from_wire(wire).rcode() == dns.rcode.REFUSED
    assert answer(b"\x12\x34garbage", addrs, tally) is None
    response = dns.message.make_response(dns.message.make_query("x.org", "A")).to_wire()
    assert answer(response, addrs, tally) is None
    assert (tally.answered, tally.refused, tally.dropped) == (2, 2, 2)
    assert tally.refused_names == ["evil.example.net"]


def test_refused_names_are_bounded() -> None:
    addrs = SyntheticAddresses([Endpoint(host="a.org", port=1, protocol="tcp")])
    tally = DnsTally()
    for i in range(100):
        answer(dns.message.make_query(f"n{i}.org", "A").to_wire(), addrs, tally)
    assert tally.refused == 100 and len(tally.refused_names) == 32


def test_resolv_conf_and_hosts_file() -> None:
    assert netsetup.resolv_conf() == b"nameserver 127.0.0.1\noptions attempts:1 timeout:1\n"
    assert netsetup.hosts_file({"api.example.org": "198.18.0.1"}) == (
        b"127.0.0.1\tlocalhost\n198.18.0.1\tapi.example.org\n"
    )
    # A declared localhost means the host's, reached through the relay.
    assert netsetup.hosts_file({"localhost": "198.18.0.1"}) == b"198.18.0.1\tlocalhost\n"


def test_only_udp_port_53_and_too_many_ports_are_unsupported() -> None:
    egress = allowlist(
        [
            Endpoint(host="a.org", port=443, protocol="https"),
            Endpoint(host="ntp.org", port=123, protocol="udp"),
            Endpoint(host="dns.example", port=53, protocol="udp"),
            Endpoint(host="dns.example", port=53, protocol="tcp"),
        ]
    )
    assert unsupported_endpoints(egress) == [
        "udp endpoint dns.example:53 is not supported: the DNS stub answers udp port 53 "
        "inside the action's network namespace"
    ]
    many = allowlist([Endpoint(host="a.org", port=p, protocol="udp") for p in range(1000, 1200)])
    assert unsupported_endpoints(many) == [
        "the allowlist names 200 distinct (port, protocol) pairs; "
        "the egress relay carries at most 125"
    ]


def test_a_declared_name_may_not_resolve_to_the_hosts_own_addresses() -> None:
    assert [
        h
        for h in ["api.example.com", "127.0.0.1", "::1", "localhost", "LocalHost."]
        if answers.screened(h)
    ] == ["api.example.com"]
    assert answers.screened("evil.localhost")  # only the name localhost itself
    refused = {
        "127.0.0.1": "loopback",
        "127.9.9.9": "loopback",
        "::1": "loopback",
        "::ffff:127.0.0.1": "loopback",
        "169.254.169.254": "link-local",
        "::ffff:169.254.169.254": "link-local",
        "fe80::1": "link-local",
        "0.0.0.0": "unspecified",
        "0.1.2.3": "unspecified",
        "::": "unspecified",
        "224.0.0.1": "multicast",
        "ff02::1": "multicast",
        "nonsense": "not an IP address",
    }
    assert {ip: answers.why_refused(ip) for ip in refused} == refused
    private = ["10.1.2.3", "172.16.0.1", "192.168.1.1", "fd00::1", "::ffff:10.0.0.1"]
    for ip in [*private, "93.184.216.34", "2606:4700::1", "100.64.0.1"]:
        assert answers.why_refused(ip) is None
    for ip in private:
        assert answers.why_refused(ip, allow_private=False) == (
            "private, and egress.allow_private_answers is false"
        )
    assert answers.why_refused("93.184.216.34", allow_private=False) is None
    # Mixed answers keep the allowed ones; none allowed is a refusal that says why.
    mixed = [("127.0.0.1", 443), ("93.184.216.34", 443)]
    assert answers.screen("api.example.com", mixed) == [("93.184.216.34", 443)]
    assert answers.screen("localhost", mixed) == mixed
    assert answers.screen("api.example.com", []) == []
    with pytest.raises(answers.RefusedAnswer, match=r"^refused: .*127\.0\.0\.1 \(loopback\)"):
        answers.screen("api.example.com", [("127.0.0.1", 443)])


def test_the_relay_screens_its_resolvers_answers_with_the_configured_private_rule() -> None:
    endpoints = [Endpoint(host="db.internal", port=5432, protocol="tcp")]

    async def resolve(host: str, port: int) -> list[tuple[str, int]]:
        return [("10.1.2.3", port)]

    async def resolved(allow: bool) -> list[tuple[str, int]]:
        relay = EgressRelay(
            allowlist(endpoints),
            SyntheticAddresses(endpoints),
            resolve=resolve,
            allow_private_answers=allow,
        )
        return await relay.resolve("db.internal", 5432)

    assert EgressConfig().allow_private_answers is True
    assert asyncio.run(resolved(True)) == [("10.1.2.3", 5432)]
    with pytest.raises(answers.RefusedAnswer, match="allow_private_answers is false"):
        asyncio.run(resolved(False))


# --- in a real network namespace -----------------------------------------------------------


def test_dns_stub_answers_declared_names_and_refuses_the_rest() -> None:
    echo = tcp_listener()
    egress = allowlist([Endpoint(host="localhost", port=echo.getsockname()[1], protocol="tcp")])

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        assert await ns.ask("dns", name="localhost") == {
            "rcode": "NOERROR",
            "answers": ["198.18.0.1"],
        }
        # Any address is local in the namespace, so a resolver the program picks itself
        # reaches the stub too; the reply must come from the address it queried.
        assert await ns.ask("dns", name="LOCALHOST.", server="10.53.53.53", source="127.0.0.1") == {
            "rcode": "NOERROR",
            "answers": ["198.18.0.1"],
        }
        assert await ns.ask("dns", name="localhost", qtype="AAAA") == {
            "rcode": "NOERROR",
            "answers": [],
        }
        # The stub has no upstream and its socket lives in the namespace, where every
        # route is local: an undeclared name cannot be forwarded anywhere.
        assert await ns.ask("dns", name="exfil.example.net") == {
            "rcode": "NXDOMAIN",
            "answers": [],
        }
        assert relay.dns_refused() == ["exfil.example.net"]
        assert relay.stub.tally.answered == 3
        assert "refused=1" in repr(relay.stub)

    relay = run(egress, [echo], scenario)
    assert relay.transcript() == []
    assert isinstance(relay.stub, DnsStub) and "closed" in repr(relay.stub)


def test_declared_connections_relay_both_ways_and_the_rest_are_refused() -> None:
    echo_a, echo_b = tcp_listener(), tcp_listener()
    pa, pb = echo_a.getsockname()[1], echo_b.getsockname()[1]
    egress = allowlist(
        [
            Endpoint(host="localhost", port=pa, protocol="tcp"),
            Endpoint(host="127.0.0.1", port=pb, protocol="tcp"),
        ]
    )

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        assert await ns.ask("tcp", ip="198.18.0.1", port=pa, send=3000) == {
            "received": 3000,
            "error": None,
        }
        assert await ns.ask("tcp", ip="127.0.0.1", port=pb, send=10) == {
            "received": 10,
            "error": None,
        }
        # No listener on an undeclared port: refused by the namespace's kernel.
        assert await ns.ask("tcp", ip="198.18.0.1", port=9, send=1) == {
            "error": "ConnectionRefusedError"
        }
        # A declared port at an undeclared address, or a declared address on another
        # host's port: accepted by the kernel, closed at once by the relay.
        for ip, port in [("10.9.9.9", pa), ("127.0.0.1", pa), ("198.18.0.1", pb)]:
            reply = await ns.ask("tcp", ip=ip, port=port, send=5)
            assert reply["received"] == 0

    relay = run(egress, [echo_a, echo_b], scenario)
    rows = [
        (r.host, r.port, r.protocol, r.bytes_sent, r.bytes_received) for r in relay.transcript()
    ]
    assert rows == [("localhost", pa, "tcp", 3000, 3000), ("127.0.0.1", pb, "tcp", 10, 10)]
    assert all(r.duration_ms >= 0 for r in relay.transcript())
    assert relay.notes == ["", ""]
    assert relay.refusals() == [
        f"undeclared destination 10.9.9.9:{pa}",
        f"undeclared destination 127.0.0.1:{pa}",
        f"undeclared destination localhost (198.18.0.1):{pb}",
    ]
    assert relay.refused_count == 3 and relay.bytes_total == 6020


def test_per_connection_cap_cuts_the_connection() -> None:
    echo = tcp_listener()
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="localhost", port=port, protocol="tcp")], per=1000)

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        reply = await ns.ask("tcp", ip="198.18.0.1", port=port, send=5000)
        assert reply["received"] <= 1000

    relay = run(egress, [echo], scenario)
    [row] = relay.transcript()
    assert row.bytes_sent + row.bytes_received == 1000
    assert relay.notes == ["capped: max_bytes_per_connection (1000) reached"]


def test_total_cap_spans_connections() -> None:
    echo = tcp_listener()
    port = echo.getsockname()[1]
    egress = allowlist([Endpoint(host="localhost", port=port, protocol="tcp")], total=3000)

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        assert (await ns.ask("tcp", ip="198.18.0.1", port=port, send=1000))["received"] == 1000
        assert (await ns.ask("tcp", ip="198.18.0.1", port=port, send=5000))["received"] <= 1000
        assert (await ns.ask("tcp", ip="198.18.0.1", port=port, send=10))["received"] == 0

    relay = run(egress, [echo], scenario)
    rows = relay.transcript()
    assert (rows[0].bytes_sent, rows[0].bytes_received) == (1000, 1000)
    assert rows[1].bytes_sent + rows[1].bytes_received == 1000
    assert (rows[2].bytes_sent, rows[2].bytes_received) == (0, 0)
    assert relay.notes == [
        "",
        "capped: max_bytes_total (3000) reached",
        "capped: max_bytes_total (3000) already spent",
    ]
    assert relay.bytes_total == 3000


def test_unreachable_declared_host_and_close_in_flight() -> None:
    echo = tcp_listener()
    port, dead = echo.getsockname()[1], free_port()
    egress = allowlist(
        [
            Endpoint(host="localhost", port=port, protocol="tcp"),
            Endpoint(host="127.0.0.1", port=dead, protocol="tcp"),
        ]
    )

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        assert (await ns.ask("tcp", ip="127.0.0.1", port=dead, send=5))["received"] == 0
        held = await ns.ask("tcp", ip="198.18.0.1", port=port, send=100, hold=1)
        assert held == {"received": 100, "error": None}
        await asyncio.wait_for(relay.close(), 3.0)
        assert "closed" in repr(relay)
        assert (await ns.ask("drain", hold=1))["received"] == 0  # reset or EOF, never data

    relay = run(egress, [echo], scenario)
    rows = relay.transcript()
    assert [(r.port, r.bytes_sent, r.bytes_received) for r in rows] == [
        (dead, 0, 0),
        (port, 100, 100),
    ]
    assert relay.notes[0].startswith(f"connect to 127.0.0.1:{dead} failed: no address answered")


def test_the_connector_resolves_and_tries_each_address() -> None:
    # localhost: the one name that may resolve to the loopback these echo servers use.
    echo = tcp_listener()
    port, dead = echo.getsockname()[1], free_port()
    egress = allowlist([Endpoint(host="localhost", port=443, protocol="tcp")])
    asked: list[tuple[str, int]] = []

    async def resolve(host: str, declared_port: int) -> list[tuple[str, int]]:
        asked.append((host, declared_port))
        return [("127.0.0.1", dead), ("127.0.0.1", port)]

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        [ip] = (await ns.ask("dns", name="localhost"))["answers"]
        assert await ns.ask("tcp", ip=ip, port=443, send=7) == {"received": 7, "error": None}

    relay = run(egress, [echo], scenario, resolve)
    assert asked == [("localhost", 443)]
    assert [(r.host, r.bytes_sent, r.bytes_received) for r in relay.transcript()] == [
        ("localhost", 7, 7)
    ]


def test_a_name_that_resolves_to_loopback_is_refused_and_the_literal_reached() -> None:
    """DNS rebinding: a declared name answered with the host's loopback would reach the
    host's own services on the declared port. The relay refuses it; the same server,
    declared by its literal address, is reached as declared."""
    echo = tcp_listener()
    port = echo.getsockname()[1]
    egress = allowlist(
        [
            Endpoint(host="rebind.example.com", port=port, protocol="tcp"),
            Endpoint(host="127.0.0.1", port=port, protocol="tcp"),
        ]
    )
    asked: list[str] = []

    async def resolve(host: str, declared_port: int) -> list[tuple[str, int]]:
        asked.append(host)
        return [("127.0.0.1", declared_port), ("::ffff:127.0.0.1", declared_port)]

    async def scenario(relay: EgressRelay, ns: Netns) -> None:
        [ip] = (await ns.ask("dns", name="rebind.example.com"))["answers"]
        assert (await ns.ask("tcp", ip=ip, port=port, send=5))["received"] == 0
        assert await ns.ask("tcp", ip="127.0.0.1", port=port, send=5) == {
            "received": 5,
            "error": None,
        }

    relay = run(egress, [echo], scenario, resolve)
    assert asked == ["rebind.example.com", "127.0.0.1"]
    rows = [(r.host, r.bytes_sent, r.bytes_received) for r in relay.transcript()]
    assert rows == [("rebind.example.com", 0, 0), ("127.0.0.1", 5, 5)]
    assert relay.notes == [
        "refused: the declared name rebind.example.com resolved to 127.0.0.1 (loopback), "
        "::ffff:127.0.0.1 (loopback), which a declared name may not reach; declare the "
        "address itself to mean it",
        "",
    ]
    assert relay.is_violation(relay.notes[0])


@pytest.mark.parametrize("hosts_exists", [True, False])
def test_the_hosts_bind_is_skipped_where_the_host_has_no_etc_hosts(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, hosts_exists: bool
) -> None:
    """A host (a minimal container) without /etc/hosts still runs C4 actions: only
    resolv.conf is bound, and it names the DNS stub, which answers the declared names."""
    from types import SimpleNamespace

    from sensorium.connectors.os.envelope import builder as envelope
    from sensorium.connectors.os.run.sandbox.plan import Mount
    from sensorium.shared.config import NodeConfig

    real_exists = os.path.exists
    monkeypatch.setattr(
        envelope.os.path,
        "exists",
        lambda p: hosts_exists if str(p) == "/etc/hosts" else real_exists(p),
    )
    decl = SimpleNamespace(
        egress_network=allowlist([Endpoint(host="api.example.org", port=443, protocol="tcp")])
    )
    prepared = SimpleNamespace(host_dirs=[], egress=None)
    mounts: list[Mount] = []
    builder = SimpleNamespace(cfg=NodeConfig())
    _egress_spec, ports = envelope.EnvelopeBuilder._egress(
        builder,  # type: ignore[arg-type]
        prepared,  # type: ignore[arg-type]
        decl,  # type: ignore[arg-type]
        tmp_path / "run",
        mounts,
    )
    assert ports == [443]
    targets = [m.target for m in mounts]
    assert targets == (["/etc/resolv.conf", "/etc/hosts"] if hosts_exists else ["/etc/resolv.conf"])
    assert b"nameserver" in (tmp_path / "run" / "resolv.conf").read_bytes()
