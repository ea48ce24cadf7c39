"""A network namespace set up as an action's C4 sandbox, and the program's side in it.

A forked child unshares a network namespace, sets it up with ``netsetup``, hands
its listeners and DNS socket to this process and then runs the program's side on
command (DNS queries, TCP connects, UDP exchanges). This process runs the relay over
those fds and real echo servers on the host's loopback (``run``).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import socket
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, cast

import dns.message
import dns.query
import dns.rcode
import pytest

from sensorium.connectors.os.effects.egress import netsetup
from sensorium.connectors.os.effects.egress.dns import SyntheticAddresses
from sensorium.connectors.os.effects.egress.relay import EgressRelay, Resolver
from sensorium.connectors.os.run.sandbox.channel import MAX_FDS
from sensorium.shared.wire.declaration import EgressNetwork, Endpoint

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.unshare.argtypes = [ctypes.c_int]
_libc.unshare.restype = ctypes.c_int


def allowlist(
    endpoints: list[Endpoint], total: int = 1_000_000, per: int = 1_000_000
) -> EgressNetwork:
    return EgressNetwork(endpoints=endpoints, max_bytes_total=total, max_bytes_per_connection=per)


# --- the program's side, inside the namespace ---------------------------------------------


def _child_dns(cmd: dict[str, Any]) -> dict[str, Any]:
    q = dns.message.make_query(cmd["name"], cmd.get("qtype", "A"))
    try:
        r = dns.query.udp(
            q, cmd.get("server", "127.0.0.1"), port=53, timeout=1.0, source=cmd.get("source")
        )
    except Exception as exc:
        return {"error": type(exc).__name__}
    ips = [rd.address for rrset in r.answer for rd in rrset]
    return {"rcode": dns.rcode.to_text(r.rcode()), "answers": ips}


def _child_tcp(cmd: dict[str, Any], held: dict[int, socket.socket]) -> dict[str, Any]:
    try:
        s = socket.create_connection((cmd["ip"], cmd["port"]), timeout=1.5)
    except OSError as exc:
        return {"error": type(exc).__name__}
    received, error = 0, None
    try:
        s.sendall(b"x" * cmd["send"])
        if cmd.get("hold"):
            while received < cmd["send"]:
                received += len(s.recv(65536))
            held[cmd["hold"]] = s
            return {"received": received, "error": None}
        s.shutdown(socket.SHUT_WR)
        while data := s.recv(65536):
            received += len(data)
    except OSError as exc:
        error = type(exc).__name__
    s.close()
    return {"received": received, "error": error}


def _child_udp(cmd: dict[str, Any], held: dict[int, socket.socket]) -> dict[str, Any]:
    """Send ``count`` datagrams of ``size`` bytes (of ``fill``) to ``ip:port`` from one
    socket (kept as ``hold`` for a later call); each waits for one reply, resent at most
    ``tries`` times (loss on loopback is not expected), unless ``burst`` sends them all
    without waiting. Counts what was sent and what came back."""
    family = socket.AF_INET6 if ":" in cmd["ip"] else socket.AF_INET
    s = held.pop(cmd.get("hold", 0), None) or socket.socket(family, socket.SOCK_DGRAM)
    s.settimeout(cmd.get("wait", 2.0))
    sent = received = replies = 0
    sources: list[str] = []
    payload = cmd.get("fill", "x").encode() * cmd["size"]
    if cmd.get("burst"):  # send them all at once, waiting for nothing
        for _ in range(cmd.get("count", 1)):
            sent += s.sendto(payload, (cmd["ip"], cmd["port"]))
        cmd["count"] = 0
    for _ in range(cmd.get("count", 1)):
        for _attempt in range(cmd.get("tries", 3)):
            try:
                sent += s.sendto(payload, (cmd["ip"], cmd["port"]))
                data, source = s.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                continue  # an ICMP unreachable for this datagram
            received += len(data)
            replies += 1
            sources.append(source[0])
            break
    if cmd.get("hold"):
        held[cmd["hold"]] = s
    else:
        s.close()
    return {"sent": sent, "received": received, "replies": replies, "sources": sources}


def _child_drain(cmd: dict[str, Any], held: dict[int, socket.socket]) -> dict[str, Any]:
    s = held.pop(cmd["hold"])
    try:
        data = s.recv(65536)
        return {"received": len(data), "error": None}
    except OSError as exc:
        return {"received": 0, "error": type(exc).__name__}
    finally:
        s.close()


def _child(ctl: socket.socket, ports: list[int], udp_ports: list[int], ipv6_off: bool) -> None:
    if _libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        ctl.send(json.dumps({"unshare": f"unshare(CLONE_NEWNET): {os.strerror(err)}"}).encode())
        return
    if ipv6_off:  # as a host whose new namespaces get disable_ipv6
        for conf in ("all", "default", "lo"):
            with open(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6", "w") as f:
                f.write("1")
    netsetup.loopback_up()
    ipv6 = netsetup.route_all_local()
    socks = [*netsetup.open_listeners(ports, udp_ports, ipv6=ipv6), netsetup.open_dns()]
    socket.send_fds(ctl, [json.dumps({"ipv6": ipv6}).encode()], [s.fileno() for s in socks])
    for s in socks:
        s.close()  # the relay owns them now
    held: dict[int, socket.socket] = {}
    while raw := ctl.recv(65536):
        cmd = json.loads(raw)
        if cmd["op"] == "dns":
            reply = _child_dns(cmd)
        elif cmd["op"] == "tcp":
            reply = _child_tcp(cmd, held)
        elif cmd["op"] == "udp":
            reply = _child_udp(cmd, held)
        else:
            reply = _child_drain(cmd, held)
        ctl.send(json.dumps(reply).encode())


class Netns:
    """A child process in its own network namespace, set up as the sandbox would."""

    def __init__(
        self,
        ports: list[int],
        inherited: list[socket.socket],
        udp_ports: list[int] | None = None,
        ipv6_off: bool = False,
    ) -> None:
        if os.geteuid() != 0:
            pytest.skip("egress tests need root to create a network namespace")
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                parent.close()
                for s in inherited:
                    s.close()
                _child(child, ports, udp_ports or [], ipv6_off)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        child.close()
        self.ctl = parent
        try:
            parent.settimeout(5.0)
            msg, fds, _flags, _addr = socket.recv_fds(parent, 65536, maxfds=MAX_FDS)
            status = json.loads(msg or b'{"unshare": "child died during setup"}')
            if "unshare" in status:
                if os.environ.get("CI") == "true":
                    pytest.fail(status["unshare"])
                pytest.skip(f"cannot create a network namespace: {status['unshare']}")
            socks = [socket.socket(fileno=fd) for fd in fds]
            self.listeners, self.dns = socks[:-1], socks[-1]
            self.ipv6: bool = status["ipv6"]
            parent.setblocking(False)
        except BaseException:
            self.close()
            raise

    async def ask(self, op: str, **cmd: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(self.ctl, json.dumps({"op": op, **cmd}).encode())
        reply: dict[str, Any] = json.loads(
            await asyncio.wait_for(loop.sock_recv(self.ctl, 65536), 5.0)
        )
        return reply

    def close(self) -> None:
        self.ctl.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
    except OSError:
        pass
    finally:
        writer.close()


class _UdpEcho(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.transport.sendto(data, addr)


class _Server:
    """An echo server (TCP or UDP) on a socket of the host side, until closed."""

    def __init__(self, close: Callable[[], None]) -> None:
        self.close = close


async def _serve_echo(sock: socket.socket) -> _Server:
    if sock.type == socket.SOCK_DGRAM:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(_UdpEcho, sock=sock)
        return _Server(transport.close)
    server = await asyncio.start_server(echo, sock=sock)
    return _Server(server.close)


def tcp_listener(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen(16)
    return s


def udp_socket(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    return s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


Scenario = Callable[[EgressRelay, Netns], Awaitable[None]]


def run(
    egress: EgressNetwork,
    echoes: list[socket.socket],
    scenario: Scenario,
    resolve: Resolver | None = None,
    *,
    ipv6_off: bool = False,
    connect_timeout: float = 2.0,
) -> EgressRelay:
    tcp = sorted({e.port for e in egress.endpoints if e.protocol != "udp"})
    udp = sorted({e.port for e in egress.endpoints if e.protocol == "udp"})
    ns = Netns(tcp, echoes, udp, ipv6_off)
    try:

        async def main() -> EgressRelay:
            servers = [await _serve_echo(s) for s in echoes]
            relay = EgressRelay(
                egress,
                SyntheticAddresses(egress.endpoints),
                resolve=resolve,
                connect_timeout=connect_timeout,
            )
            await relay.start(ns.listeners, ns.dns)
            try:
                await scenario(relay, ns)
            finally:
                await asyncio.wait_for(relay.close(), 3.0)
                await relay.close()  # idempotent
                for server in servers:
                    server.close()
            return relay

        return asyncio.run(main())
    finally:
        ns.close()
        for s in echoes:
            s.close()
