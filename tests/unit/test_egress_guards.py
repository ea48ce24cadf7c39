"""C4's relay: bounded connections, and http/https only to the declared name.

Each relayed connection holds two of the connector's fds; before the caps, three
actions holding ~1,024 idle connections each took the connector past the
supervisor's fd limit (issue 16, item 12). Before the name check, an ``http``
endpoint relayed any ``Host:`` (item 14). A forked child in its own network
namespace plays the action: it opens connections through the relay.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import socket
import ssl
import traceback
from pathlib import Path
from typing import Any

import pytest
from egress_netns import echo as netns_echo

from sensorium.connectors.os.effects.egress import netsetup, sniff
from sensorium.connectors.os.effects.egress.dns import SyntheticAddresses
from sensorium.connectors.os.effects.egress.relay import EgressRelay, RelayBudget
from sensorium.connectors.os.run.sandbox.channel import MAX_FDS
from sensorium.shared.config import ConfigError, load_node_config
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import EgressNetwork, Endpoint

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _open(cmd: dict[str, Any], held: list[socket.socket]) -> dict[str, Any]:
    """Open ``n`` connections, send a byte on each and wait for its echo: held if it
    comes back, counted as cut if the relay closed it instead."""
    relayed = cut = 0
    for _ in range(cmd["n"]):
        s = socket.create_connection((cmd["ip"], cmd["port"]), timeout=5.0)
        try:
            s.sendall(b"x")
            echoed = s.recv(1)
        except OSError:
            echoed = b""
        if echoed:
            relayed += 1
            held.append(s)
        else:
            cut += 1
            s.close()
    return {"relayed": relayed, "cut": cut}


def _raw(cmd: dict[str, Any]) -> dict[str, Any]:
    """Send bytes, half-close, and count what comes back until EOF (or a reset)."""
    received = 0
    with socket.create_connection((cmd["ip"], cmd["port"]), timeout=5.0) as s:
        try:
            s.sendall(bytes.fromhex(cmd["hex"]))
            s.shutdown(socket.SHUT_WR)
            while data := s.recv(65536):
                received += len(data)
        except OSError:
            pass
    return {"received": received}


def _child(ctl: socket.socket, port: int) -> None:
    if _libc.unshare(CLONE_NEWNET) != 0:
        err = os.strerror(ctypes.get_errno())
        ctl.send(json.dumps({"unshare": f"unshare(CLONE_NEWNET): {err}"}).encode())
        return
    netsetup.loopback_up()
    netsetup.route_all_local()
    socks = [*netsetup.open_listeners([port]), netsetup.open_dns()]
    socket.send_fds(ctl, [b"{}"], [s.fileno() for s in socks])
    for s in socks:
        s.close()
    held: list[socket.socket] = []
    while raw := ctl.recv(65536):
        cmd = json.loads(raw)
        if cmd["op"] == "open":
            reply = _open(cmd, held)
        elif cmd["op"] == "raw":
            reply = _raw(cmd)
        else:
            for s in held:
                s.close()
            reply = {"closed": len(held)}
            held.clear()
        ctl.send(json.dumps(reply).encode())


class Action:
    """One action's network namespace and the relay the connector runs for it."""

    def __init__(
        self, port: int, *, max_open: int, budget: RelayBudget, protocol: str = "tcp"
    ) -> None:
        if os.geteuid() != 0:
            pytest.skip("egress tests need root to create a network namespace")
        self.port = port
        endpoints = [Endpoint(host="localhost", port=port, protocol=protocol)]
        egress = EgressNetwork(
            endpoints=endpoints, max_bytes_total=1_000_000, max_bytes_per_connection=100_000
        )
        self.relay = EgressRelay(
            egress, SyntheticAddresses(endpoints), max_open=max_open, budget=budget
        )
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                parent.close()
                _child(child, port)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        child.close()
        self.ctl = parent
        parent.settimeout(5.0)
        msg, fds, _flags, _addr = socket.recv_fds(parent, 65536, maxfds=MAX_FDS)
        status = json.loads(msg or b'{"unshare": "child died during setup"}')
        if "unshare" in status:
            self.close()
            if os.environ.get("CI") == "true":
                pytest.fail(status["unshare"])
            pytest.skip(f"cannot create a network namespace: {status['unshare']}")
        self.socks = [socket.socket(fileno=fd) for fd in fds]
        parent.setblocking(False)

    async def start(self) -> None:
        await self.relay.start(self.socks[:-1], self.socks[-1])

    async def ask(self, op: str, **cmd: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(self.ctl, json.dumps({"op": op, **cmd}).encode())
        reply: dict[str, Any] = json.loads(
            await asyncio.wait_for(loop.sock_recv(self.ctl, 65536), 30.0)
        )
        return reply

    async def open(self, n: int) -> dict[str, Any]:
        return await self.ask("open", ip="198.18.0.1", port=self.port, n=n)

    async def send(self, data: bytes) -> int:
        reply = await self.ask("raw", ip="198.18.0.1", port=self.port, hex=data.hex())
        return int(reply["received"])

    def close(self) -> None:
        self.ctl.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


def _run(body: Any) -> None:
    echo = socket.socket()
    echo.bind(("127.0.0.1", 0))
    echo.listen(256)

    async def main() -> None:
        server = await asyncio.start_server(netns_echo, sock=echo)
        try:
            await body(echo.getsockname()[1])
        finally:
            server.close()

    try:
        asyncio.run(main())
    finally:
        echo.close()


def test_an_action_holds_at_most_its_share_and_all_actions_the_total() -> None:
    budget = RelayBudget(12)

    async def body(port: int) -> None:
        a = Action(port, max_open=8, budget=budget)
        b = Action(port, max_open=8, budget=budget)
        try:
            await a.start()
            await b.start()
            # A's share is 8: the 9th and 10th are cut, not relayed.
            assert await a.open(10) == {"relayed": 8, "cut": 2}
            assert budget.open == 8
            # B is within its share, but the node's total is 12: 4 more, then none.
            assert await b.open(6) == {"relayed": 4, "cut": 2}
            assert budget.open == 12
            # A lets go of its connections: B may take what they held.
            assert await a.ask("close") == {"closed": 8}
            await a.relay.close()
            assert budget.open == 4
            assert await b.open(3) == {"relayed": 3, "cut": 0}
            assert budget.open == 7
        finally:
            for action in (a, b):
                await action.relay.close()
                action.close()
        assert budget.open == 0
        assert len(a.relay.transcript()) == 8 and a.relay.refused_count == 2
        assert a.relay.refusals() == [
            "more than 8 connections open at once (egress.max_connections_per_action)"
        ]
        assert len(b.relay.transcript()) == 7 and b.relay.refused_count == 2
        assert b.relay.refusals() == [
            "the node relays at most 12 connections at once (egress.max_connections_total)"
        ]

    _run(body)


def test_tearing_down_held_connections_leaves_nothing_for_the_loop_to_report() -> None:
    reported: list[dict[str, Any]] = []

    async def body(port: int) -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: reported.append(ctx))
        action = Action(port, max_open=64, budget=RelayBudget(64))
        try:
            await action.start()
            assert await action.open(40) == {"relayed": 40, "cut": 0}
            await action.relay.close()  # the action's time is up while all 40 are open
        finally:
            action.close()
        await asyncio.sleep(0)  # done callbacks of the torn-down tasks run here

    _run(body)
    # Before: one "Exception in callback … CancelledError" traceback per connection.
    assert [str(ctx.get("message")) for ctx in reported] == []


def test_the_relay_caps_must_leave_the_connector_its_fds(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.node_config.parent.mkdir(parents=True)
    defaults = load_node_config(paths)
    assert 2 * defaults.egress.max_connections_total + 1024 <= defaults.supervisor.max_fds
    paths.node_config.write_text(json.dumps({"egress": {"max_connections_total": 2000}}))
    with pytest.raises(ConfigError, match=r"must leave 1024 of supervisor.max_fds \(4096\)"):
        load_node_config(paths)
    paths.node_config.write_text(
        json.dumps({"egress": {"max_connections_total": 8, "max_connections_per_action": 9}})
    )
    with pytest.raises(ConfigError, match="max_connections_per_action"):
        load_node_config(paths)
    paths.node_config.write_text(
        json.dumps({"egress": {"max_connections_total": 3000}, "supervisor": {"max_fds": 8192}})
    )
    assert load_node_config(paths).egress.max_connections_total == 3000


# --- http and https: only the declared name ------------------------------------------------


def _client_hello(server_hostname: str | None) -> bytes:
    """What Python's TLS client sends first: a real ClientHello."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _request(host: str, target: str = "/") -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n\r\n".encode()


def test_an_http_endpoint_relays_only_requests_for_its_host() -> None:
    async def body(port: int) -> None:
        action = Action(port, max_open=8, budget=RelayBudget(8), protocol="http")
        try:
            await action.start()
            good = _request(f"LocalHost:{port}")
            assert await action.send(good) == len(good)
            # Before: relayed, so one declared address served any site behind it.
            assert await action.send(_request("evil.example")) == 0
            assert await action.send(_request(f"localhost:{port + 1}")) == 0
            assert await action.send(_request("localhost", "http://evil.example/")) == 0
            assert await action.send(b"GET / HTTP/1.0\r\n\r\n") == 0
        finally:
            await action.relay.close()
            action.close()
        rows = action.relay.transcript()
        assert [(r.bytes_sent, r.bytes_received) for r in rows] == [(len(good), len(good))] + [
            (0, 0)
        ] * 4
        assert action.relay.notes == [
            "",
            f"refused: Host 'evil.example' is not the declared localhost:{port}",
            f"refused: Host 'localhost' port {port + 1} is not the declared localhost:{port}",
            "refused: the request target 'http://evil.example/' names another host "
            "(http endpoints are checked for Host)",
            "refused: no Host header (http endpoints are checked for Host)",
        ]

    _run(body)


def test_an_https_endpoint_relays_only_a_client_hello_for_its_name() -> None:
    async def body(port: int) -> None:
        action = Action(port, max_open=8, budget=RelayBudget(8), protocol="https")
        try:
            await action.start()
            good = _client_hello("localhost")
            assert await action.send(good) == len(good)
            assert await action.send(_client_hello("evil.example")) == 0
            assert await action.send(_client_hello(None)) == 0  # no name for a named host
            assert await action.send(_request("localhost")) == 0  # not TLS at all
        finally:
            await action.relay.close()
            action.close()
        assert action.relay.notes == [
            "",
            f"refused: TLS server name (SNI) 'evil.example' is not the declared localhost:{port}",
            f"refused: TLS server name (SNI) none is not the declared localhost:{port}",
            "refused: the connection does not start with a TLS handshake "
            "(https endpoints are checked for TLS server name (SNI))",
        ]

    _run(body)


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (b"GET / HTTP/1.1\r\nHost: a.org\r\nHost: b.org\r\n\r\n", "more than one Host header"),
        (b"GET / HTTP/1.1\r\nHost: a.org\r\n b.org\r\n\r\n", "folded header line"),
        (b"GET / HTTP/1.1\r\nHost : a.org\r\n\r\n", "malformed header line"),
        (b"CONNECT b.org:443 HTTP/1.1\r\nHost: a.org\r\n\r\n", "CONNECT"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/2"),
        (b"GET / HTTP/1.1\r\nHost: user@a.org\r\n\r\n", "not a host"),
        (b"\x16\x03\x01\x00\x05hello", "HTTP/1 request line"),
        (b"GET / HTTP/1.1\r\nX: " + b"y" * sniff.MAX_HEAD_BYTES, "no end of the request head"),
    ],
)
def test_http_heads_that_cannot_be_checked_are_refused(head: bytes, reason: str) -> None:
    with pytest.raises(sniff.Unreadable, match=reason):
        sniff.http_host(head)


def test_http_host_forms() -> None:
    assert sniff.http_host(b"GET / HTTP/1.1\r\nHost: a.org") is None  # more to come
    assert sniff.http_host(b"GET / HTTP/1.1\nhost:A.Org.\n\n") == sniff.Named("a.org")
    assert sniff.http_host(b"GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n") == sniff.Named(
        "::1", 8080
    )
    head = b"GET http://a.org:80/x HTTP/1.1\r\nHost: a.org\r\n\r\n"
    assert sniff.http_host(head) == sniff.Named("a.org")
    assert sniff.matches(sniff.Named("a.org"), "A.org.", 80)
    assert not sniff.matches(sniff.Named("a.org", 81), "a.org", 80)
    assert sniff.matches(sniff.Named(None), "10.0.0.1", 443)  # TLS to an address: no SNI
    assert not sniff.matches(sniff.Named(None), "a.org", 443)


def test_client_hello_forms() -> None:
    hello = _client_hello("api.example.org")
    assert sniff.tls_server_name(hello) == sniff.Named("api.example.org")
    assert sniff.tls_server_name(hello[:40]) is None  # more to come
    assert sniff.tls_server_name(_client_hello("10.0.0.1")) == sniff.Named(None)
    # The same handshake split over two records is still read whole.
    body = hello[5:]
    split = (
        b"\x16\x03\x01"
        + (100).to_bytes(2, "big")
        + body[:100]
        + b"\x16\x03\x01"
        + (len(body) - 100).to_bytes(2, "big")
        + body[100:]
    )
    assert sniff.tls_server_name(split) == sniff.Named("api.example.org")
    with pytest.raises(sniff.Unreadable, match="not a ClientHello"):
        sniff.tls_server_name(b"\x16\x03\x03\x00\x04\x02\x00\x00\x00")
    with pytest.raises(sniff.Unreadable, match="no complete ClientHello"):
        sniff.tls_server_name(b"\x16\x03\x01\x40\x00" + b"\x01\xff\xff\xff" * 4096)
