"""CurveZMQ on tcp endpoints: who may talk to core and to the connector seam (DESIGN §2).

An ipc endpoint is guarded by its 0700 directory; a tcp one by CURVE alone, never
plaintext. A CURVE server socket gets its key pair and a ZAP handler on its context:
a client key not on the allowlist is refused during the handshake, before any
message is read (the client sees nothing), and the refusal is logged with the key's
fingerprint. An accepted key becomes the connection's ZAP ``User-Id`` (its Z85 text),
which is what the server's per-request ``authorize`` hook is given.

Who is on which allowlist:

- core's client API: ``keys/curve/clients/*.key`` (each with its grant), plus the
  node's own ``core`` key with every group (the poller and the local CLI use it);
- the connector seam: the node's ``core`` key alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import zmq
import zmq.asyncio
import zmq.utils.z85

from sensorium.shared.config import ConfigError, NodeConfig, connector_endpoint, core_endpoint
from sensorium.shared.logs import LibraryLogger
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.curvekeys import (
    ALL_GROUPS,
    ANY_MODULE,
    CONNECTOR,
    CORE,
    SERVER,
    ClientEntry,
    CurveKeyError,
    CurveStore,
    fingerprint,
    read_cert,
)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
# A refused key retries its handshake every second or so: log it once a minute.
REFUSAL_LOG_EVERY_S = 60.0
MAX_REMEMBERED_REFUSALS = 4096
# The node's own key, as it appears in grants checks and logs.
NODE_CLIENT = "core"
log = LibraryLogger("sensorium.rpc")


def is_tcp(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")


class Allowlist(Protocol):
    def lookup(self, public_key: str) -> ClientEntry | None: ...


class FixedAllowlist:
    """A list known at start: the connector seam's (core's key alone)."""

    def __init__(self, entries: list[ClientEntry]) -> None:
        self._by_key = {e.public_key: e for e in entries}

    def __repr__(self) -> str:
        return f"<FixedAllowlist {[e.name for e in self._by_key.values()]}>"

    def lookup(self, public_key: str) -> ClientEntry | None:
        return self._by_key.get(public_key)


class DirectoryAllowlist:
    """``clients/*.key`` plus fixed entries, re-read when the directory changes (every
    ``sensorium keys`` write is a rename there) and at least every ``recheck_s``: a
    revoked key or a changed grant holds from the next request on, without a restart."""

    def __init__(
        self, store: CurveStore, fixed: list[ClientEntry], *, recheck_s: float = 2.0
    ) -> None:
        self._store = store
        self._fixed = {e.public_key: e for e in fixed}
        self._recheck_s = recheck_s
        self._by_key: dict[str, ClientEntry] = {}
        self._sig: tuple[int, int] | None = None
        self._read_at = float("-inf")
        self._problems: set[str] = set()

    def __repr__(self) -> str:
        return f"<DirectoryAllowlist {self._store.clients_dir} clients={len(self._by_key)}>"

    def lookup(self, public_key: str) -> ClientEntry | None:
        fixed = self._fixed.get(public_key)
        if fixed is not None:
            return fixed
        self._refresh()
        return self._by_key.get(public_key)

    def _refresh(self) -> None:
        try:
            st = os.stat(self._store.clients_dir)
            sig: tuple[int, int] | None = (st.st_mtime_ns, st.st_ino)
        except OSError:
            sig = None
        now = time.monotonic()
        if sig == self._sig and now - self._read_at < self._recheck_s:
            return
        entries, problems = self._store.clients()
        for p in set(problems) - self._problems:
            log.warning("rpc.curve.client_unreadable", problem=p)
        self._problems = set(problems)
        self._by_key = {e.public_key: e for e in entries}
        self._sig, self._read_at = sig, now


@dataclass(frozen=True)
class ClientKeys:
    """What a client needs for a tcp endpoint: its own pair and the server's public key.

    ``ClientKeys.load(path)`` reads a secret certificate; one made by ``sensorium keys
    client add`` (``keys/curve/issued/NAME.key_secret``) names the server's key too.
    """

    public_key: str
    secret_key: str = field(repr=False)
    server_key: str
    # The client name the node knows the key by (a `keys client add` certificate says
    # it): the issuer module a key bound to nothing may claim, so clients default to it.
    name: str | None = None

    @classmethod
    def load(cls, path: str | os.PathLike[str], server_key: str | None = None) -> ClientKeys:
        cert = read_cert(Path(path), secret=True)
        server = server_key or cert.metadata.get("server-public-key")
        if not server:
            raise CurveKeyError(
                f"{path} does not name the server's public key: pass server_key= "
                "(`sensorium keys curve show` prints it on the node)"
            )
        assert cert.secret_key is not None
        return cls(cert.public_key, cert.secret_key, server, cert.metadata.get("name"))

    def apply(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_key.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key.encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key.encode())


@dataclass(frozen=True)
class CurveServer:
    """A server socket's pair, who may connect, and its ZAP domain."""

    public_key: str
    secret_key: str = field(repr=False)
    allowlist: Allowlist
    domain: str

    def apply(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key.encode())
        # A ZAP domain makes libzmq ask our handler about every handshake.
        sock.setsockopt(zmq.ZAP_DOMAIN, self.domain.encode())


class ZapHandler:
    """Answers libzmq's ZAP requests (RFC 27) for one CURVE server on one context.

    Bound before the server socket, so no handshake is ever decided without it.
    Anything it cannot read, any other mechanism or domain, any unknown key: 400.
    """

    def __init__(self, ctx: zmq.asyncio.Context, server: CurveServer, name: str) -> None:
        self._ctx = ctx
        self._server = server
        self._name = name
        self._sock: zmq.asyncio.Socket | None = None
        self._refused: dict[str, tuple[float, int]] = {}
        self.accepted = 0
        self.refused = 0

    def __repr__(self) -> str:
        return f"<ZapHandler {self._name} accepted={self.accepted} refused={self.refused}>"

    def bind(self) -> None:
        sock = self._ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise RuntimeError(
                f"{self._name}: this context already has a ZAP handler; "
                "one CURVE server per context"
            ) from exc
        self._sock = sock

    async def serve(self) -> None:
        assert self._sock is not None, "bind() first"
        while True:
            frames = await self._sock.recv_multipart()
            try:
                reply = self.decide(frames)
            except Exception:
                log.exception("rpc.curve.zap_failed", server=self._name)
                reply = [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", b"error", b"", b""]
            await self._sock.send_multipart(reply)

    def decide(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6:
            return [b"1.0", frames[1] if len(frames) > 1 else b"", b"400", b"malformed", b"", b""]
        version, rid, domain, address, _identity, mechanism, *credentials = frames
        if version != b"1.0":
            return [b"1.0", rid, b"400", b"unsupported ZAP version", b"", b""]
        if (
            mechanism != b"CURVE"
            or domain != self._server.domain.encode()
            or len(credentials) != 1
            or len(credentials[0]) != 32
        ):
            log.warning(
                "rpc.curve.refused",
                server=self._name,
                mechanism=mechanism.decode(errors="replace")[:16],
                address=address.decode(errors="replace")[:64],
                reason="CURVE required",
            )
            self.refused += 1
            return [b"1.0", rid, b"400", b"CURVE required", b"", b""]
        key = zmq.utils.z85.encode(credentials[0]).decode()
        entry = self._server.allowlist.lookup(key)
        if entry is None:
            self.refused += 1
            self._log_refusal(key, address.decode(errors="replace")[:64])
            return [b"1.0", rid, b"400", b"key not allowlisted", b"", b""]
        self.accepted += 1
        log.info(
            "rpc.curve.accepted",
            server=self._name,
            client=entry.name,
            key=entry.fingerprint,
            address=address.decode(errors="replace")[:64],
        )
        return [b"1.0", rid, b"200", b"OK", key.encode(), b""]

    def _log_refusal(self, key: str, address: str) -> None:
        fp = fingerprint(key)
        now = time.monotonic()
        last, suppressed = self._refused.get(fp, (float("-inf"), 0))
        if now - last < REFUSAL_LOG_EVERY_S:
            self._refused[fp] = (last, suppressed + 1)
            return
        if len(self._refused) >= MAX_REMEMBERED_REFUSALS:
            self._refused.clear()
        self._refused[fp] = (now, 0)
        log.warning(
            "rpc.curve.refused",
            server=self._name,
            key=fp,
            address=address,
            reason="key not allowlisted",
            suppressed=suppressed,
        )

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None


# -- which keys each process uses ---------------------------------------------------


def _pair(store: CurveStore, role: str, where: str, endpoint: str) -> tuple[str, str]:
    try:
        cert = store.pair(role)
    except FileNotFoundError:
        raise ConfigError(
            f"{where} is {endpoint}: a tcp endpoint is served only with CURVE, and "
            f"{store.secret_path(role)} does not exist. Run `sensorium keys curve init "
            f"--state-dir {store.root.parent.parent}` first"
        ) from None
    except (OSError, CurveKeyError) as exc:
        raise ConfigError(f"{where} is {endpoint}: {exc}") from exc
    assert cert.secret_key is not None
    return cert.public_key, cert.secret_key


def _node_entry(public_key: str) -> ClientEntry:
    # The operator's own key (poller, local CLI): every action, any issuer, as over ipc.
    return ClientEntry(NODE_CLIENT, public_key, (ALL_GROUPS,), (ANY_MODULE,))


def core_server_curve(cfg: NodeConfig, paths: StatePaths) -> CurveServer | None:
    """Core's client-API server on tcp: allowlisted clients and the node's own key."""
    endpoint = core_endpoint(cfg, paths)
    if not is_tcp(endpoint):
        return None
    store = CurveStore(paths)
    public, secret = _pair(store, SERVER, "endpoints.core", endpoint)
    node, _ = _pair(store, CORE, "endpoints.core", endpoint)
    allow = DirectoryAllowlist(store, [_node_entry(node)])
    return CurveServer(public, secret, allow, "sensorium-core")


def connector_server_curve(cfg: NodeConfig, paths: StatePaths) -> CurveServer | None:
    """The connector seam on tcp: core's key alone."""
    endpoint = connector_endpoint(cfg, paths)
    if not is_tcp(endpoint):
        return None
    store = CurveStore(paths)
    public, secret = _pair(store, CONNECTOR, "endpoints.connector", endpoint)
    node, _ = _pair(store, CORE, "endpoints.connector", endpoint)
    return CurveServer(public, secret, FixedAllowlist([_node_entry(node)]), "sensorium-connector")


def seam_client_curve(cfg: NodeConfig, paths: StatePaths) -> ClientKeys | None:
    """Core's keys for calling the connector over tcp."""
    endpoint = connector_endpoint(cfg, paths)
    if not is_tcp(endpoint):
        return None
    store = CurveStore(paths)
    public, secret = _pair(store, CORE, "endpoints.connector", endpoint)
    server, _ = _pair(store, CONNECTOR, "endpoints.connector", endpoint)
    return ClientKeys(public, secret, server)


def core_client_curve(cfg: NodeConfig, paths: StatePaths) -> ClientKeys | None:
    """The node's own keys for calling core over tcp (the poller, the local CLI)."""
    endpoint = core_endpoint(cfg, paths)
    if not is_tcp(endpoint):
        return None
    store = CurveStore(paths)
    public, secret = _pair(store, CORE, "endpoints.core", endpoint)
    server, _ = _pair(store, SERVER, "endpoints.core", endpoint)
    return ClientKeys(public, secret, server)


def check_endpoints(cfg: NodeConfig, paths: StatePaths) -> None:
    """Every tcp endpoint has its keys: a ``ConfigError`` at start, never plaintext tcp."""
    core_server_curve(cfg, paths)
    connector_server_curve(cfg, paths)
