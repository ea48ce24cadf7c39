"""CURVE key files, the allowlist, grants, endpoint rules and `sensorium keys` (no sockets)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.auth

from sensorium.client.cli.main import main as cli
from sensorium.client.endpoint import core_curve
from sensorium.connectors.os.catalog.authorization import sign_effective
from sensorium.core.grants import Grants, core_server_security, granted
from sensorium.shared.config import ConfigError, Endpoints, NodeConfig, load_node_config
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.keys import KeyPair, new_operator_key, trust_signer
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.curve import (
    ClientKeys,
    DirectoryAllowlist,
    check_endpoints,
    connector_server_curve,
    seam_client_curve,
)
from sensorium.shared.rpc.curvekeys import (
    ALL_GROUPS,
    CORE,
    ROLES,
    SERVER,
    ClientEntry,
    CurveKeyError,
    CurveStore,
    fingerprint,
    read_cert,
)
from sensorium.shared.rpc.sockets import IpcEndpointError, prepare_ipc
from sensorium.shared.wire.client_api import (
    FlowRun,
    Health,
    Invoke,
    OperationCancel,
    OperationStatusRequest,
)
from sensorium.shared.wire.directive import Issuer, new_directive
from sensorium.shared.wire.flow import FlowDefinition, FlowStep

TCP = {"core": "tcp://127.0.0.1:45555", "connector": "tcp://127.0.0.1:45556"}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_makes_private_pairs_once_and_zmq_reads_them(state_dir: StatePaths) -> None:
    store = CurveStore(state_dir)
    first = store.init()
    assert set(first) == set(ROLES) and all(made for _key, made in first.values())
    for role in ROLES:
        assert _mode(store.secret_path(role)) == 0o600
        assert _mode(store.public_path(role)) == 0o644
        public, secret = zmq.auth.load_certificate(store.secret_path(role))
        assert public.decode() == first[role][0] and secret is not None
    for d in (state_dir.keys, store.root, store.clients_dir, store.issued_dir):
        assert _mode(d) == 0o700
    again = store.init()
    assert {r: k for r, (k, _) in again.items()} == {r: k for r, (k, _) in first.items()}
    assert not any(made for _key, made in again.values())


def test_a_secret_key_must_be_private(state_dir: StatePaths) -> None:
    store = CurveStore(state_dir)
    store.init()
    os.chmod(store.secret_path(SERVER), 0o644)
    with pytest.raises(CurveKeyError, match="must be 0600"):
        store.pair(SERVER)
    with pytest.raises(ConfigError, match="must be 0600"):
        check_endpoints(NodeConfig(endpoints=msgspec.convert(TCP, Endpoints)), state_dir)


def test_clients_add_grant_revoke_round_trip(state_dir: StatePaths) -> None:
    store = CurveStore(state_dir)
    store.init()
    alice, issued = store.add_client("alice", ["demo.filesystem"])
    assert issued is not None and _mode(issued) == 0o600
    keys = ClientKeys.load(issued)
    assert keys.public_key == alice.public_key and keys.server_key == store.public(SERVER)
    assert keys.secret_key not in repr(keys)
    outside = zmq.curve_keypair()[0].decode()
    bob, none = store.add_client("bob", ["*"], public_key=outside)
    assert none is None and bob.public_key == outside
    with pytest.raises(CurveKeyError, match="exists"):
        store.add_client("bob", [])
    for bad_name in ("", "../x", "a b", "-x"):
        with pytest.raises(CurveKeyError):
            store.add_client(bad_name, [])
    for bad_group in ("a,b", "", "x y", '"'):
        with pytest.raises(CurveKeyError):
            store.set_grants("alice", [bad_group])
    assert store.set_grants("alice", ["demo.*", "ops"]).grants == ("demo.*", "ops")
    entries, problems = store.clients()
    assert [(e.name, e.grants) for e in entries] == [("alice", ("demo.*", "ops")), ("bob", ("*",))]
    assert problems == []
    assert store.revoke("alice") and not issued.exists() and not store.revoke("alice")
    assert [e.name for e in store.clients()[0]] == ["bob"]


def test_allowlist_follows_the_directory_without_a_restart(state_dir: StatePaths) -> None:
    store = CurveStore(state_dir)
    store.init()
    node = ClientEntry("core", store.public(CORE), (ALL_GROUPS,))
    allow = DirectoryAllowlist(store, [node], recheck_s=3600)
    assert allow.lookup(node.public_key) == node
    alice, _ = store.add_client("alice", ["a"])
    assert allow.lookup(alice.public_key) == alice
    store.set_grants("alice", ["b"])
    looked = allow.lookup(alice.public_key)
    assert looked is not None and looked.grants == ("b",)
    store.revoke("alice")
    assert allow.lookup(alice.public_key) is None
    (store.clients_dir / "junk.key").write_text("not a certificate\n")
    assert allow.lookup(alice.public_key) is None  # an unreadable file is skipped, not fatal


def test_grant_semantics() -> None:
    assert granted(("*",), None, None) and granted(("*",), "a.b", "x")
    # By group (a display aid the operator may also grant by).
    assert granted(("demo.*",), "x.y", "demo") and granted(("demo.*",), "x.y", "demo.filesystem")
    assert not granted(("demo.*",), "x.y", "demonstration") and not granted(
        ("demo.*",), "x.y", None
    )
    assert granted(("ops",), "x.y", "ops") and not granted(("ops",), "x.y", "ops.sub")
    assert not granted((), "x.y", "ops")
    # By action id and action-id pattern: an ungrouped action is grantable by name.
    assert granted(("demo.fs.stat",), "demo.fs.stat", None)
    assert not granted(("demo.fs.stat",), "demo.fs.stat-more", None)
    assert granted(("demo.fs.*",), "demo.fs.stat", None)
    assert granted(("demo.*",), "demo.fs.stat", None)
    assert not granted(("demo.fs.*",), "demo.fsx.stat", None)
    assert not granted(("demo.fs.*",), None, None)  # no action: only '*'


def _invoke(action_id: str, issuer: Issuer | None = None) -> Invoke:
    # A key bound to no module may issue as its own name only: alice's tests send that.
    d = new_directive(action_id, {}, issuer=issuer or Issuer(module_id="alice"))
    return Invoke(request_id=new_id(), directive=d)


def test_grants_authorize_what_a_key_may_run(state_dir: StatePaths) -> None:
    store = CurveStore(state_dir)
    store.init()
    alice, _ = store.add_client("alice", ["demo.*"])
    groups = {"demo.fs.stat": "demo.filesystem", "ops.reboot": "ops", "loose": None}
    ops = {"op1": "ops.reboot", "op2": "demo.fs.stat"}
    grants = Grants(DirectoryAllowlist(store, []), groups.get, ops.get)
    grants.authorize(alice.public_key, _invoke("demo.fs.stat"))
    grants.authorize(alice.public_key, Health(request_id=new_id()))  # reads are open
    grants.authorize(
        alice.public_key, OperationStatusRequest(request_id=new_id(), operation_id="op1")
    )
    grants.authorize(alice.public_key, OperationCancel(request_id=new_id(), operation_id="op2"))
    grants.authorize(alice.public_key, OperationCancel(request_id=new_id(), operation_id="nope"))
    # An ungrouped action granted by its id, another by an action-id pattern.
    bob, _ = store.add_client("bob", ["loose", "ops.*"])
    grants.authorize(bob.public_key, _invoke("loose", Issuer(module_id="bob")))
    grants.authorize(bob.public_key, _invoke("ops.reboot", Issuer(module_id="bob")))
    with pytest.raises(CodedError, match="ACTION-OR-GROUP"):
        grants.authorize(bob.public_key, _invoke("demo.fs.stat", Issuer(module_id="bob")))
    denied = [
        _invoke("ops.reboot"),
        _invoke("loose"),  # ungrouped, and not granted by its id
        _invoke("no.such.action"),
        OperationCancel(request_id=new_id(), operation_id="op1"),
        FlowRun(
            request_id=new_id(),
            flow=FlowDefinition(
                steps=[
                    FlowStep(step_id="a", action_id="demo.fs.stat", output_binding="a"),
                    FlowStep(step_id="b", action_id="ops.reboot", output_binding="b"),
                ]
            ),
        ),
    ]
    for request in denied:
        with pytest.raises(CodedError) as info:
            grants.authorize(alice.public_key, request)
        assert info.value.code == RuntimeErrorCode.GRANT_DENIED
        assert "alice" in info.value.message and alice.fingerprint in info.value.message
    # A cancel with no way to name its action needs '*'.
    blind = Grants(DirectoryAllowlist(store, []), groups.get)
    with pytest.raises(CodedError, match="grant"):
        blind.authorize(alice.public_key, OperationCancel(request_id=new_id(), operation_id="op2"))
    # Revoked while connected, or no key at all: nothing is granted.
    store.revoke("alice")
    for key in (alice.public_key, None):
        with pytest.raises(CodedError) as info:
            grants.authorize(key, _invoke("demo.fs.stat"))
        assert info.value.code == RuntimeErrorCode.GRANT_DENIED


def test_a_key_issues_only_as_the_modules_it_is_bound_to(state_dir: StatePaths) -> None:
    store = CurveStore(state_dir)
    store.init()
    alice, _ = store.add_client("alice", ["*"])
    arca, _ = store.add_client("arca", ["*"], modules=["orbiplex.arca", "orbiplex.dator"])
    gateway, _ = store.add_client("gateway", ["*"], modules=["*"])
    assert alice.claims == ("alice",) and arca.claims == ("orbiplex.arca", "orbiplex.dator")
    assert store.client("arca").modules == arca.modules  # kept in the certificate
    node = ClientEntry("core", store.public(CORE), (ALL_GROUPS,), ("*",))
    grants = Grants(DirectoryAllowlist(store, [node]), lambda _a: "demo")
    participant = "participant:did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp"
    allowed = [
        (alice, Issuer(module_id="alice")),
        (arca, Issuer(module_id="orbiplex.dator")),
        (gateway, Issuer(module_id="anything.at.all")),
        (gateway, Issuer(participant_did_key=participant)),  # '*': any issuer, unsigned too
        (node, Issuer(module_id="orbiplex.arca", participant_did_key=participant)),
    ]
    for entry, issuer in allowed:
        grants.authorize(entry.public_key, _invoke("demo.fs.stat", issuer))
    refused = [
        (alice, Issuer(module_id="orbiplex.arca"), "$.directive.issuer.module_id"),
        (arca, Issuer(module_id="alice"), "$.directive.issuer.module_id"),
        (
            arca,
            Issuer(module_id="orbiplex.arca", participant_did_key=participant),
            "$.directive.issuer.participant/did:key",
        ),
    ]
    for entry, issuer, path in refused:
        with pytest.raises(CodedError) as info:
            grants.authorize(entry.public_key, _invoke("demo.fs.stat", issuer))
        assert info.value.code == RuntimeErrorCode.GRANT_DENIED and info.value.path == path
        assert entry.name in info.value.message
    with pytest.raises(CurveKeyError, match="module"):
        store.add_client("bad", [], modules=["a,b"])


@pytest.mark.parametrize(
    ("endpoints", "problem"),
    [
        ({"core": "tcp://*:5555"}, "no '\\*'"),
        ({"core": "tcp://127.0.0.1"}, "tcp://HOST:PORT"),
        ({"connector": "tcp://127.0.0.1:70000"}, "1-65535"),
        ({"supervisor": "tcp://127.0.0.1:5555"}, "must start with ipc://"),
        ({"core": "ipc://@abstract"}, "absolute path"),
        ({"core": "inproc://x"}, "ipc:// or tcp://"),
    ],
)
def test_endpoint_rules(state_dir: StatePaths, endpoints: dict[str, str], problem: str) -> None:
    state_dir.ensure()
    state_dir.node_config.write_text(json.dumps({"endpoints": endpoints}))
    with pytest.raises(ConfigError, match=problem):
        load_node_config(state_dir)


def test_tcp_without_keys_refuses_to_start_and_ipc_needs_none(state_dir: StatePaths) -> None:
    ipc = NodeConfig()
    security = core_server_security(ipc, state_dir, lambda _a: None)
    assert security.curve is None and security.authorize is None
    assert (
        connector_server_curve(ipc, state_dir) is None and seam_client_curve(ipc, state_dir) is None
    )
    assert core_curve("ipc:///x/core.sock", str(state_dir.root), None) is None
    tcp = NodeConfig(endpoints=msgspec.convert(TCP, Endpoints))
    with pytest.raises(ConfigError, match="sensorium keys curve init"):
        core_server_security(tcp, state_dir, lambda _a: None)
    with pytest.raises(ConfigError, match="served only with CURVE"):
        check_endpoints(tcp, state_dir)
    with pytest.raises(ConfigError, match=r"ClientKeys\.load"):
        core_curve(TCP["core"], str(state_dir.root), None)
    CurveStore(state_dir).init()
    check_endpoints(tcp, state_dir)
    security = core_server_security(tcp, state_dir, lambda _a: None)
    assert security.curve is not None and security.authorize is not None
    local = core_curve(TCP["core"], str(state_dir.root), None)
    assert local is not None and local.server_key == security.curve.public_key
    seam = seam_client_curve(tcp, state_dir)
    connector = connector_server_curve(tcp, state_dir)
    assert seam is not None and connector is not None
    assert seam.server_key == connector.public_key
    # The seam lets core's key in, and nobody else's.
    assert connector.allowlist.lookup(seam.public_key) is not None
    alice, _ = CurveStore(state_dir).add_client("alice", ["*"])
    assert connector.allowlist.lookup(alice.public_key) is None
    assert security.curve.allowlist.lookup(alice.public_key) is not None


def test_ipc_directories_are_made_private_or_refused(tmp_path: Path) -> None:
    run = tmp_path / "state" / "run"
    prepare_ipc(f"ipc://{run}/core.sock")
    assert _mode(run) == 0o700
    os.chmod(run, 0o755)
    prepare_ipc(f"ipc://{run}/core.sock")
    assert _mode(run) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    for endpoint in ("ipc:///tmp/core.sock", f"ipc://{shared}/core.sock", "ipc://@abstract"):
        with pytest.raises(IpcEndpointError):
            prepare_ipc(endpoint)
    assert _mode(shared) == 0o1777  # refused, never chmod-ed
    prepare_ipc("tcp://127.0.0.1:1")  # not ipc: nothing to do


def _catalog_with_groups(paths: StatePaths, *groups: str) -> None:
    """A drop-in with one action per group (test.GROUP.one), as an operator writes it."""
    paths.ensure()
    decls = [
        {
            "action_id": f"test.{g}.one",
            "class": "read-only-spawn",
            "group": g,
            "executable": {"kind": "binary", "path": "/usr/bin/true", "argv_shape": ["true"]},
            "parameters_schema": {"type": "object", "additionalProperties": False},
        }
        for g in groups
    ]
    dropins = paths.connectors_config / "sensorium-os.d"
    dropins.mkdir(parents=True, exist_ok=True)
    (dropins / "50-test.json").write_text(
        json.dumps({"schema": "sensorium-os-config.v1", "action_catalog": decls})
    )


def test_cli_grants_only_what_the_catalog_holds(
    state_dir: StatePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 18, item 11: a grant that matches no action and no group is refused, with
    what the catalog does hold; '*' and 'audit' are always grantable."""
    root = str(state_dir.root)
    _catalog_with_groups(state_dir, "ops")
    add = ["keys", "client", "add", "alice", "--state-dir", root]
    assert cli([*add, "--grant", "demo.fs.statt"]) == 1
    err = capsys.readouterr().err
    assert "'demo.fs.statt' matches no action and no group" in err
    assert "demo.filesystem" in err and "demo.fs.stat" in err and "test.ops.one" in err
    assert not (CurveStore(state_dir).clients_dir / "alice.key").exists()
    for grant in ("demo.fs.stat", "demo.fs.*", "demo.filesystem", "ops", "test.*", "*", "audit"):
        assert cli([*add, "--grant", grant]) == 0, capsys.readouterr()
        assert cli(["keys", "client", "revoke", "alice", "--state-dir", root]) == 0
    assert cli([*add, "--grant", "ops"]) == 0
    assert cli(["keys", "client", "grant", "alice", "nosuch.*", "--state-dir", root]) == 1
    assert "'nosuch.*' matches no action" in capsys.readouterr().err
    assert CurveStore(state_dir).client("alice").grants == ("ops",)
    # The catalog the node runs is the signed one: grants are checked against it.
    sign_effective(state_dir, _operator(state_dir))
    _catalog_with_groups(state_dir, "later")  # edited, not signed yet
    assert cli(["keys", "client", "grant", "alice", "later", "--state-dir", root]) == 1
    assert "the signed catalog" in capsys.readouterr().err
    assert cli(["keys", "client", "grant", "alice", "ops", "--state-dir", root]) == 0


def test_cli_refuses_a_grant_when_no_catalog_can_be_read(
    state_dir: StatePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir.ensure()
    dropins = state_dir.connectors_config / "sensorium-os.d"
    dropins.mkdir(parents=True, exist_ok=True)
    (dropins / "50-broken.json").write_text("{not json")
    add = ["keys", "client", "add", "alice", "--state-dir", str(state_dir.root)]
    assert cli([*add, "--grant", "demo.fs.stat"]) == 1
    assert "no catalog can be read" in capsys.readouterr().err
    assert cli([*add, "--grant", "*"]) == 0  # '*' needs no catalog


def _operator(paths: StatePaths) -> KeyPair:
    pair, _path = new_operator_key(paths, "did:test:operator")
    trust_signer(paths, pair)
    return pair


def test_cli_manages_clients(state_dir: StatePaths, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(state_dir.root)
    _catalog_with_groups(state_dir, "test", "ops")
    assert cli(["keys", "curve", "init", "--json", "--state-dir", root]) == 0
    made = json.loads(capsys.readouterr().out)["keys"]
    assert set(made) == set(ROLES) and made["server"]["fingerprint"].startswith("curve:")
    assert cli(["keys", "client", "add", "alice", "--grant", "test", "--state-dir", root]) == 0
    assert "issued/alice.key_secret" in capsys.readouterr().out
    assert cli(["keys", "client", "grant", "alice", "ops", "--state-dir", root]) == 0
    assert cli(["keys", "client", "ungrant", "alice", "test", "--state-dir", root]) == 0
    capsys.readouterr()
    assert cli(["keys", "client", "list", "--json", "--state-dir", root]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["server_key"] == made["server"]["public_key"]
    [alice] = listing["clients"]
    assert alice["name"] == "alice" and alice["grants"] == ["ops"]
    assert alice["modules"] == ["alice"]  # bound to none: its own name
    add = ["keys", "client", "add", "arca", "--module", "orbiplex.arca", "--state-dir", root]
    assert cli(add) == 0
    assert "issues as: orbiplex.arca" in capsys.readouterr().out
    bind = ["keys", "client", "bind", "alice", "orbiplex.dator", "*", "--state-dir", root]
    assert cli(bind) == 0
    assert "issues as: orbiplex.dator, *" in capsys.readouterr().out
    assert CurveStore(state_dir).client("alice").modules == ("orbiplex.dator", "*")
    unbind = ["keys", "client", "unbind", "alice", "orbiplex.dator", "*", "--state-dir", root]
    assert cli(unbind) == 0
    assert "issues as: alice (its name: no --module)" in capsys.readouterr().out
    assert alice["fingerprint"] == fingerprint(alice["public_key"])
    assert cli(["keys", "client", "add", "x y", "--state-dir", root]) == 1
    assert "client name" in capsys.readouterr().err
    assert cli(["keys", "client", "revoke", "alice", "--state-dir", root]) == 0
    assert cli(["keys", "client", "revoke", "alice", "--state-dir", root]) == 1
    assert read_cert(CurveStore(state_dir).public_path(SERVER)).secret_key is None
