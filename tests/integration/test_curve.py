"""Who may talk to it: CURVE on tcp endpoints, grants per client, 0700 ipc (DESIGN §2).

Real sockets on 127.0.0.1: first one CURVE RpcServer in this process (what its ZAP
handler lets through, what ``authorize`` refuses), then the whole stack with core
and the connector seam on tcp.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import apsw
import msgspec
import pytest
import zmq
import zmq.asyncio
from harness import (
    SENSORIUM,
    TEST_ACTIONS,
    Stack,
    free_port,
    keys_cli,
    python_action,
    start_stack,
    write_dropin,
)

from sensorium.client import AsyncClient, Client
from sensorium.client.errors import GrantDenied, SensoriumError, Unavailable
from sensorium.core.grants import Grants
from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.client import RpcClient
from sensorium.shared.rpc.curve import ClientKeys, CurveServer, DirectoryAllowlist
from sensorium.shared.rpc.curvekeys import CONNECTOR, CORE, SERVER, CurveStore, fingerprint
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.client_api import (
    ClientRequest,
    Health,
    HealthReply,
    Invoke,
    RecordStart,
)
from sensorium.shared.wire.directive import Issuer, new_directive
from sensorium.shared.wire.report import ModuleReport
from sensorium.shared.wire.seam import ConnectorReport

# -- one CURVE server in this process ---------------------------------------------


@dataclass
class World:
    server: RpcServer
    endpoint: str
    store: CurveStore
    seen: list[str]
    ctx: zmq.asyncio.Context
    # What the request hook (core's recorder) was shown: only admitted requests.
    observed: list[str]

    def keys(self, name: str) -> ClientKeys:
        return ClientKeys.load(self.store.issued_dir / f"{name}.key_secret")

    def client(self, curve: ClientKeys | None) -> RpcClient:
        return RpcClient(self.ctx, self.endpoint, name="core", curve=curve)


GROUPS = {"fs.stat": "fs", "ops.reboot": "ops"}


async def _handle(world_seen: list[str], req: Health | Invoke) -> HealthReply:
    world_seen.append(type(req).__name__)
    return HealthReply(process="core", instance_id=new_id(), started_at=rfc3339(), version="t")


@contextlib.asynccontextmanager
async def curve_world(state_dir: StatePaths) -> AsyncIterator[World]:
    store = CurveStore(state_dir)
    store.init()
    store.add_client("alice", ["fs"])
    server_pair = store.pair(SERVER)
    assert server_pair.secret_key is not None
    allow = DirectoryAllowlist(store, [])
    curve = CurveServer(server_pair.public_key, server_pair.secret_key, allow, "sensorium-core")
    seen: list[str] = []
    observed: list[str] = []

    async def handle(req: Health | Invoke) -> HealthReply:
        return await _handle(seen, req)

    server_ctx = zmq.asyncio.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = RpcServer(
        server_ctx,
        endpoint,
        ClientRequest,
        {Health: handle, Invoke: handle},
        name="core",
        curve=curve,
        authorize=Grants(allow, GROUPS.get).authorize,
        on_request=lambda _peer, _raw, req, _t: observed.append(type(req).__name__),
    )
    server.bind()
    serving = asyncio.create_task(server.serve())
    ctx = zmq.asyncio.Context()
    try:
        yield World(server, endpoint, store, seen, ctx, observed)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        server.close()
        server_ctx.term()
        ctx.term()


def _invoke(action_id: str) -> Invoke:
    # alice is bound to no module: she may issue as her own name only.
    d = new_directive(action_id, {}, issuer=Issuer(module_id="alice"))
    return Invoke(request_id=new_id(), directive=d)


async def _connected(client: RpcClient, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while not client.connected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return client.connected


def test_an_allowlisted_key_runs_what_it_is_granted_and_nothing_else(
    state_dir: StatePaths,
) -> None:
    asyncio.run(_granted_and_nothing_else(state_dir))


async def _granted_and_nothing_else(state_dir: StatePaths) -> None:
    async with curve_world(state_dir) as world:
        await _granted(world)


async def _granted(world: World) -> None:
    client = world.client(world.keys("alice"))
    try:
        assert await _connected(client)
        await client.call(Health(request_id=new_id()), HealthReply, 2.0)
        await client.call(_invoke("fs.stat"), HealthReply, 2.0)
        for action in ("ops.reboot", "ungrouped.action"):
            with pytest.raises(CodedError) as info:
                await client.call(_invoke(action), HealthReply, 2.0)
            assert info.value.code == RuntimeErrorCode.GRANT_DENIED
        assert world.seen == ["Health", "Invoke"]  # the refused ones never reached a handler
        assert world.observed == world.seen  # nor a recording: a replay would run them
        # Recording holds every caller's parameters: only the `*` grant controls it.
        with pytest.raises(CodedError) as info:
            await client.call(RecordStart(request_id=new_id()), HealthReply, 2.0)
        assert info.value.code == RuntimeErrorCode.GRANT_DENIED
        # Widened while connected: holds from the next request on.
        world.store.set_grants("alice", ["fs", "ops"])
        await client.call(_invoke("ops.reboot"), HealthReply, 2.0)
        # Revoked while connected: refused from the next request on.
        world.store.revoke("alice")
        with pytest.raises(CodedError) as info:
            await client.call(_invoke("fs.stat"), HealthReply, 2.0)
        assert info.value.code == RuntimeErrorCode.GRANT_DENIED and "revoked" in info.value.message
    finally:
        await client.close()


def test_an_unknown_key_or_no_key_gets_nothing(state_dir: StatePaths) -> None:
    asyncio.run(_nothing(state_dir))


async def _nothing(state_dir: StatePaths) -> None:
    async with curve_world(state_dir) as world:
        await _strangers(world)


async def _strangers(world: World) -> None:
    public, secret = (k.decode() for k in zmq.curve_keypair())
    stranger = ClientKeys(public, secret, world.store.public(SERVER))
    # The node's own server key offered by a client is no pass either.
    alice = world.keys("alice")
    wrong_server = ClientKeys(alice.public_key, alice.secret_key, world.store.public(CONNECTOR))
    for curve in (stranger, wrong_server, None):
        client = world.client(curve)
        try:
            assert not await _connected(client, 0.5)
            with pytest.raises(CodedError) as info:
                await client.call(Health(request_id=new_id()), HealthReply, 1.0)
            assert info.value.code == RuntimeErrorCode.CORE_UNAVAILABLE
            if curve is stranger:
                assert client.refused and "refused this client's CURVE" in info.value.message
        finally:
            await client.close()
    assert world.seen == []  # not one message was read from any of them
    zap = world.server._zap
    assert zap is not None and zap.refused >= 1 and zap.accepted == 0


def test_an_ipc_server_lives_in_a_0700_directory(state_dir: StatePaths) -> None:
    async def run() -> None:
        ctx = zmq.asyncio.Context()
        endpoint = state_dir.ipc("core")
        server = RpcServer(ctx, endpoint, ClientRequest, {}, name="core")
        server.bind()
        try:
            assert stat.S_IMODE(state_dir.run.stat().st_mode) == 0o700
        finally:
            server.close()
            ctx.term()

    asyncio.run(run())


# -- the whole stack on tcp ----------------------------------------------------------

CURVE_ACTIONS = [
    *TEST_ACTIONS[:1],  # test.echo-args, group "test"
    python_action(
        "ops.echo", "echo_args.py", ["--", "{{value}}"], {"value": {"type": "string"}}, group="ops"
    ),
]


@pytest.fixture(scope="module")
def tcp_stack() -> Iterator[Stack]:
    """Core and the connector seam on tcp; clients alice (group test) and bob (ops.*),
    bound to no module, and arca (test) bound to module orbiplex.arca."""
    paths = StatePaths(Path(tempfile.mkdtemp(prefix="st-", dir="/tmp")))
    paths.ensure()
    root = str(paths.root)
    # Grants are checked against the catalog: it is written before the keys.
    write_dropin(paths, "50-tests", CURVE_ACTIONS)
    keys_cli(root, "curve", "init")
    keys_cli(root, "client", "add", "alice", "--grant", "test")
    keys_cli(root, "client", "add", "bob", "--grant", "ops.*")
    keys_cli(root, "client", "add", "arca", "--grant", "test", "--module", "orbiplex.arca")
    keys_cli(root, "client", "add", "carol", "--grant", "test", "--grant", "audit")
    keys_cli(root, "client", "add", "dave", "--grant", "test.echo-args")  # an action id
    node = {
        "endpoints": {
            "core": f"tcp://127.0.0.1:{free_port()}",
            "connector": f"tcp://127.0.0.1:{free_port()}",
        }
    }
    stack = start_stack(paths, CURVE_ACTIONS, node)
    try:
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(paths.root, ignore_errors=True)


def test_a_tcp_endpoint_without_keys_stops_up_at_once(state_dir: StatePaths) -> None:
    state_dir.ensure()
    port = free_port()
    state_dir.node_config.write_text(json.dumps({"endpoints": {"core": f"tcp://127.0.0.1:{port}"}}))
    done = subprocess.run(
        [*SENSORIUM, "up", "--state-dir", str(state_dir.root)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 78, done.stderr
    assert "served only with CURVE" in done.stderr and "sensorium keys curve init" in done.stderr
    with socket.socket() as probe:  # and nothing listens there in plaintext
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def _core(stack: Stack) -> str:
    node = json.loads(stack.paths.node_config.read_text())
    return str(node["endpoints"]["core"])


def test_stack_serves_granted_clients_over_curve(tcp_stack: Stack) -> None:
    issued = CurveStore(tcp_stack.paths).issued_dir
    alice_keys = ClientKeys.load(issued / "alice.key_secret")
    with Client(_core(tcp_stack), curve=alice_keys, module_id="alice") as alice:
        out = alice.invoke("test.echo-args", {"value": "over tcp"})
        assert out.status == "completed" and json.loads(out.stdout.text) == ["--", "over tcp"]
        with pytest.raises(GrantDenied) as info:
            alice.invoke("ops.echo", {"value": "x"})
        assert info.value.code == "grant-denied"
    with Client(
        _core(tcp_stack), curve=ClientKeys.load(issued / "bob.key_secret"), module_id="bob"
    ) as bob:
        assert bob.invoke("ops.echo", {"value": "y"}).status == "completed"
        with pytest.raises(GrantDenied):
            bob.invoke("test.echo-args", {"value": "z"})

    async def asynchronously() -> None:
        keys = ClientKeys.load(issued / "bob.key_secret")
        async with AsyncClient(_core(tcp_stack), curve=keys, module_id="bob") as bob:
            assert (await bob.invoke("ops.echo", {"value": "a"})).status == "completed"
            with pytest.raises(GrantDenied):
                await bob.invoke("test.echo-args", {"value": "b"})

    asyncio.run(asynchronously())
    # The local CLI uses the node's own key, granted everything.
    done = tcp_stack.cli("invoke", "ops.echo", "--param", "value=cli")
    assert done.returncode == 0, done.stderr


def test_a_grant_names_an_action_by_its_id(tcp_stack: Stack) -> None:
    """Issue 18, item 11: grants by action id; the group is a display aid."""
    keys = ClientKeys.load(CurveStore(tcp_stack.paths).issued_dir / "dave.key_secret")
    with Client(_core(tcp_stack), curve=keys, module_id="dave") as dave:
        assert dave.invoke("test.echo-args", {"value": "by id"}).status == "completed"
        with pytest.raises(GrantDenied):
            dave.invoke("ops.echo", {"value": "x"})
    # A grant that names nothing in the catalog is refused before it is written.
    grant = ["keys", "client", "grant", "dave", "test.echo-arg"]
    done = subprocess.run(
        [*SENSORIUM, *grant, "--state-dir", str(tcp_stack.paths.root)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "matches no action and no group" in done.stderr
    assert "test.echo-args" in done.stderr and "ops.echo" in done.stderr


def test_a_granted_key_is_refused_an_unknown_action_as_ipc_is_and_an_ungranted_one_is_not(
    tcp_stack: Stack,
) -> None:
    """Over CURVE, core's receive loop refuses an unknown action at once only for a key
    granted it (bob: ``ops.*``); a key without the grant (alice) is told grant-denied, as
    before. Both answers name a record that is there."""
    issued = CurveStore(tcp_stack.paths).issued_dir
    answers = {}
    for name in ("bob", "alice"):
        keys = ClientKeys.load(issued / f"{name}.key_secret")
        with Client(_core(tcp_stack), curve=keys, module_id=name) as c:
            with pytest.raises(SensoriumError) as info:
                c.invoke("ops.no-such-action", {})
            answers[name] = info.value
    assert answers["bob"].code == "action-not-allowlisted"
    assert answers["alice"].code == "grant-denied"
    ids = [answers[n].detail["outcome/id"] for n in ("bob", "alice")]
    for _ in range(200):  # refusals are queued; bounded by count, not time
        # A connection per look: one held open would keep reading its first snapshot.
        with apsw.Connection(str(tcp_stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as db:
            db.set_busy_timeout(5000)
            rows = dict(
                db.execute(
                    "SELECT record_id, code FROM records WHERE record_id IN (?, ?)", ids
                ).fetchall()
            )
        if len(rows) == 2:
            break
        time.sleep(0.05)
    assert rows == {ids[0]: "action-not-allowlisted", ids[1]: "grant-denied"}


def _echo_records(stack: Stack) -> tuple[list[tuple[str, str | None]], int]:
    """(kind, code) of test.echo-args' audit records, and how many were dispatched."""
    with apsw.Connection(str(stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as db:
        rows = db.execute(
            "SELECT kind, code FROM records WHERE action_id = 'test.echo-args'"
        ).fetchall()
        [(dispatched,)] = db.execute(
            "SELECT count(*) FROM dispatches WHERE action_id = 'test.echo-args'"
        ).fetchall()
    return [(str(k), None if c is None else str(c)) for k, c in rows], int(dispatched)


def test_a_key_bound_to_a_module_cannot_issue_as_another(
    tcp_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = CurveStore(tcp_stack.paths).issued_dir
    before, dispatched_before = _echo_records(tcp_stack)
    arca = ClientKeys.load(issued / "arca.key_secret")
    with Client(_core(tcp_stack), curve=arca, module_id="orbiplex.arca") as c:
        assert c.invoke("test.echo-args", {"value": "as arca"}).status == "completed"
    for claim in ("orbiplex.dator", "arca", "alice"):  # not even its own client name
        with Client(_core(tcp_stack), curve=arca, module_id=claim) as c:
            with pytest.raises(GrantDenied) as info:
                c.invoke("test.echo-args", {"value": f"as {claim}"})
            assert info.value.path == "$.directive.issuer.module_id"
            assert "orbiplex.arca" in info.value.message
    alice = ClientKeys.load(issued / "alice.key_secret")
    with (
        Client(_core(tcp_stack), curve=alice, module_id="orbiplex.arca") as c,
        pytest.raises(GrantDenied, match="may not issue as module"),
    ):
        c.invoke("test.echo-args", {"value": "alice as arca"})
    # Each refusal is audited and nothing was dispatched: only the one run above.
    for _ in range(200):  # rejections are queued; bounded by count, not time
        after, dispatched = _echo_records(tcp_stack)
        if len(after) - len(before) >= 5:
            break
        time.sleep(0.05)
    new = list(after)
    for row in before:
        new.remove(row)
    assert sorted(new, key=str) == sorted(
        [("outcome", None)] + [("rejection", "grant-denied")] * 4, key=str
    )
    assert dispatched == dispatched_before + 1
    # The local CLI (the node's own key) may issue as anyone.
    monkeypatch.setenv("SENSORIUM_MODULE_ID", "any.module")
    done = tcp_stack.cli("invoke", "test.echo-args", "--param", "value=cli")
    assert done.returncode == 0, done.stderr


def test_the_audit_is_read_only_by_keys_granted_audit_by_name(tcp_stack: Stack) -> None:
    issued = CurveStore(tcp_stack.paths).issued_dir
    with Client(_core(tcp_stack), curve=ClientKeys.load(issued / "alice.key_secret")) as alice:
        ran = alice.invoke("test.echo-args", {"value": "audited"})
        with pytest.raises(GrantDenied) as denied:
            alice.invoke("ops.echo", {"value": "x"})
        refused = denied.value.detail["outcome/id"]  # a denial is a rejected result too
        for read in (lambda: alice.audit_get(ran.outcome_id), lambda: alice.audit_query()):
            with pytest.raises(GrantDenied) as info:
                read()
            assert "audit" in info.value.message
    with Client(_core(tcp_stack), curve=ClientKeys.load(issued / "carol.key_secret")) as carol:
        assert carol.audit_get(ran.outcome_id).status == "completed"
        rec = carol.audit_get(refused)
        assert rec.status == "rejected" and rec.diagnostics[0].code == "grant-denied"
        assert carol.audit_query(status="rejected").records


def test_stack_gives_a_stranger_nothing_and_says_so_in_its_log(tcp_stack: Stack) -> None:
    public, secret = (k.decode() for k in zmq.curve_keypair())
    server = CurveStore(tcp_stack.paths).public(SERVER)
    with (
        Client(
            _core(tcp_stack), curve=ClientKeys(public, secret, server), connect_timeout_s=0.5
        ) as stranger,
        pytest.raises(Unavailable) as info,
    ):
        stranger.health()
    assert "refused this client's CURVE" in info.value.message
    # Plaintext: the handshake fails on the mechanism, and nothing is read either.
    ctx = zmq.Context()
    plain = ctx.socket(zmq.DEALER)
    try:
        plain.setsockopt(zmq.LINGER, 0)
        plain.connect(_core(tcp_stack))
        plain.send(msgspec.msgpack.encode(Health(request_id=new_id())))
        assert not plain.poll(500)
    finally:
        plain.close(linger=0)
        ctx.term()
    assert _logged(tcp_stack, "core", "rpc.curve.refused", fingerprint(public))
    # The poller reached core over CURVE with the node's own key.
    assert _logged(tcp_stack, "poller", "rpc.peer.connected", _core(tcp_stack))


def test_the_connector_seam_refuses_every_key_but_cores(tcp_stack: Stack) -> None:
    store = CurveStore(tcp_stack.paths)
    alice = ClientKeys.load(store.issued_dir / "alice.key_secret")
    seam = json.loads(tcp_stack.paths.node_config.read_text())["endpoints"]["connector"]
    as_alice = ClientKeys(alice.public_key, alice.secret_key, store.public(CONNECTOR))
    with (
        SyncRpcClient(seam, name="connector", connect_timeout_s=0.5, curve=as_alice) as c,
        pytest.raises(CodedError) as info,
    ):
        c.call(ConnectorReport(request_id=new_id()), ModuleReport, 1.0)
    assert info.value.code == RuntimeErrorCode.CORE_UNAVAILABLE
    assert _logged(tcp_stack, "connector", "rpc.curve.refused", fingerprint(alice.public_key))
    core_pair = store.pair(CORE)
    assert core_pair.secret_key is not None
    as_core = ClientKeys(core_pair.public_key, core_pair.secret_key, store.public(CONNECTOR))
    with SyncRpcClient(seam, name="connector", connect_timeout_s=2.0, curve=as_core) as c:
        assert c.call(ConnectorReport(request_id=new_id()), ModuleReport, 5.0).catalog_exposed


def _logged(stack: Stack, process: str, event: str, key: str, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            for line in stack.paths.log_file(process).read_text().splitlines():
                if event in line and key in line:
                    return True
        time.sleep(0.05)
    return False


def test_a_client_with_an_unbound_key_issues_as_the_key_name_by_default(tcp_stack: Stack) -> None:
    """A key bound to no module may claim only its own client name; the client says so
    by itself, so the first try with nothing but the key file works."""
    issued = CurveStore(tcp_stack.paths).issued_dir
    keys = ClientKeys.load(issued / "alice.key_secret")
    assert keys.name == "alice"
    with Client(_core(tcp_stack), curve=keys) as c:
        assert c.issuer.module_id == "alice"
        assert c.invoke("test.echo-args", {"value": "first try"}).status == "completed"
