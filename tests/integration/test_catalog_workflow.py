"""The operator's loop with real processes: edit → refused (and why) → sign → restart →
enabled; the ledger and the connector never disagree along the way."""

from __future__ import annotations

import json

import pytest
from harness import TEST_ACTIONS, Stack, start_stack, write_dropin

from sensorium.client import SensoriumError
from sensorium.connectors.os.catalog.authorization import sidecar_path
from sensorium.shared.paths import StatePaths


@pytest.fixture
def pristine(state_dir: StatePaths) -> Stack:
    s = start_stack(state_dir)
    try:
        s.wait_ready()
        yield s  # type: ignore[misc]
    finally:
        s.stop()


def _ledger(stack: Stack) -> dict[str, str]:
    res = stack.cli("ledger", "--json")
    assert res.returncode == 0, res.stderr
    return {
        e["capabilityRef"].rsplit(":", 1)[-1]: e["effectiveState"]
        for e in json.loads(res.stdout)["entries"]
    }


def _refused(stack: Stack, action_id: str = "demo.system.uptime") -> SensoriumError:
    with stack.client() as c, pytest.raises(SensoriumError) as err:
        c.invoke(action_id)
    assert err.value.code == "action-catalog-unauthorized"
    return err.value


def test_pristine_factory_catalog_is_node_signed_and_runs(pristine: Stack) -> None:
    res = pristine.cli("catalog", "verify")
    assert res.returncode == 0 and res.stdout.startswith("ok"), res.stdout
    sidecar = json.loads(sidecar_path(pristine.paths).read_text())
    assert "node_id" in sidecar["signer"] and "participant/id" not in sidecar["signer"]
    with pristine.client() as c:
        assert c.invoke("demo.system.uptime").connector_unauthorized is False
    assert set(_ledger(pristine).values()) == {"enabled"}


@pytest.mark.slow
def test_edit_refuse_sign_restart_enable(pristine: Stack) -> None:
    s = pristine
    write_dropin(s.paths, "50-mine", [TEST_ACTIONS[0]])
    # The very next directive is refused before any spawn, with the reason.
    err = _refused(s)
    assert err.detail.get("reason") == "hash-mismatch" or "hash-mismatch" in err.message
    assert set(_ledger(s).values()) == {"blocked_by_policy"}
    assert not s.cli("actions").stdout.count("demo.system.uptime")
    diff = s.cli("catalog", "diff")
    assert "test.echo-args" in diff.stdout
    assert s.cli("catalog", "verify").returncode == 1

    keys = s.cli("keys", "new", "--participant", "did:example:operator", "--trust")
    assert keys.returncode == 0, keys.stdout + keys.stderr
    signed = s.cli("catalog", "sign", "--yes")
    assert signed.returncode == 0, signed.stdout
    assert (
        "did:example:operator"
        in json.loads(sidecar_path(s.paths).read_text())["signer"]["participant/id"]
    )
    # Signed on disk, but the running connector still holds the old catalog.
    _refused(s)

    old = s.pids()["connector"]
    assert s.cli("restart", "connector").returncode == 0
    s.wait_replaced("connector", old)
    with s.client() as c:
        out = c.invoke("test.echo-args", {"value": "after"})
        assert out.status == "completed" and out.connector_unauthorized is False
    ledger = _ledger(s)
    assert ledger["test.echo-args"] == "enabled" and ledger["demo.system.uptime"] == "enabled"
    status = {c.name: c for c in s.status().children}["connector"]
    assert status.state == "ready"  # an operator restart is not a failure


def test_a_corrupted_sidecar_refuses_the_next_directive(pristine: Stack) -> None:
    path = sidecar_path(pristine.paths)
    doc = json.loads(path.read_text())
    value = doc["signature"]["value"]
    doc["signature"]["value"] = ("A" if value[0] != "A" else "B") + value[1:]
    path.write_text(json.dumps(doc))
    err = _refused(pristine)
    assert "signature-invalid" in err.message
    res = pristine.cli("catalog", "verify")
    assert res.returncode == 1 and res.stdout.startswith("signature-invalid")


def test_unsigned_edit_under_allow_unsigned_bootstrap_runs_loudly(state_dir: StatePaths) -> None:
    s = start_stack(state_dir, [TEST_ACTIONS[0]], sign=False)
    write_dropin(state_dir, "10-bootstrap", [])
    d = state_dir.connectors_config / "sensorium-os.d" / "10-bootstrap.json"
    d.write_text(json.dumps({"allow_unsigned_bootstrap": True, "action_catalog": []}))
    try:
        s.wait_ready()
        with s.client() as c:
            out = c.invoke("test.echo-args", {"value": "x"})
        assert out.status == "completed" and out.connector_unauthorized is True
        logs = (state_dir.logs / "connector.jsonl").read_text()
        assert "catalog.unsigned" in logs
    finally:
        s.stop()


def test_validate_lints_a_file_and_reports_every_problem(state_dir: StatePaths) -> None:
    import subprocess

    from harness import SENSORIUM

    bad = state_dir.root / "bad.json"
    state_dir.root.mkdir(parents=True, exist_ok=True)
    bad.write_text(
        json.dumps(
            {
                "action_catalog": [
                    dict(TEST_ACTIONS[0], action_id="Bad ID"),
                    dict(TEST_ACTIONS[1], **{"class": "operator-gated-spawn"}),
                    dict(TEST_ACTIONS[2], default_timeout_ms=99_000, max_timeout_ms=1_000),
                ]
            }
        )
    )
    res = subprocess.run(
        [*SENSORIUM, "catalog", "validate", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1
    assert "Bad ID" in res.stdout and "reserved" in res.stdout
    assert "exceeds max_timeout_ms" in res.stdout


def _raw_invoke(stack: Stack, action_id: str) -> str:
    """Invoke without the client's catalog lookup: only core's own view decides."""
    from sensorium.client.endpoint import core_endpoint
    from sensorium.shared.errors import CodedError
    from sensorium.shared.ids import new_id
    from sensorium.shared.rpc.sync_client import SyncRpcClient
    from sensorium.shared.wire.client_api import Invoke
    from sensorium.shared.wire.directive import Issuer, new_directive
    from sensorium.shared.wire.result import DirectiveResult

    with SyncRpcClient(core_endpoint(state_dir=str(stack.paths.root)), name="core") as rpc:
        try:
            out = rpc.call(
                Invoke(
                    request_id=new_id(),
                    directive=new_directive(action_id, issuer=Issuer(module_id="sensorium.tests")),
                ),
                DirectiveResult,
                20,
            )
        except CodedError as exc:
            return exc.code
    # A refusal at admission is a `rejected` result: its code, as the client raises it.
    if out.status == "rejected":
        return out.diagnostics[0].code
    return out.outcome.status if out.outcome is not None else out.status


def test_a_repaired_sidecar_is_honoured_at_once(pristine: Stack) -> None:
    path = sidecar_path(pristine.paths)
    good = path.read_bytes()
    path.write_text("{broken")
    assert _raw_invoke(pristine, "demo.system.uptime") == "action-catalog-unauthorized"
    path.write_bytes(good)
    assert _raw_invoke(pristine, "demo.system.uptime") == "completed"


def test_an_unauthorized_first_start_shows_every_action_blocked(state_dir: StatePaths) -> None:
    s = start_stack(state_dir, [TEST_ACTIONS[0]], sign=False)
    try:
        s.wait_ready(actions=False)
        s.wait_connected()
        ledger = _ledger(s)
        assert ledger and set(ledger.values()) == {"blocked_by_policy"}
        assert "test.echo-args" in ledger and "demo.system.uptime" in ledger
        assert _raw_invoke(s, "test.echo-args") == "action-catalog-unauthorized"
    finally:
        s.stop()
