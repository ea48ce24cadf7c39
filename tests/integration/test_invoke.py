"""Directives end to end through real processes: CLI, Python client, rejections, audit."""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import os
import time
from typing import Any

import apsw
import jsonschema
import msgspec
import pytest
import zmq
from harness import Stack
from signing import Signer, delegation, signed

from sensorium.client import ActionNotAllowlisted, AsyncClient, ParametersInvalid
from sensorium.client.endpoint import core_endpoint
from sensorium.shared.clock import rfc3339
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.directive import Issuer, new_directive
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.recording import read_recording
from sensorium.shared.wire.result import DirectiveResult

INVOKE = "sensorium.directive.invoke"
DIRECTIVE_SCHEMA = "sensorium-directive.v1.schema.json"

DEMO_CALLS = {
    "demo.fs.list-directory": {"path": "/etc"},
    "demo.fs.read-head": {"path": "/etc/os-release", "lines": 2},
    "demo.fs.hash-file": {"path": "/etc/hostname"},
    "demo.fs.stat": {"path": "/etc/hostname"},
    "demo.system.uptime": {},
}


def test_every_demo_action_runs_from_python(stack: Stack) -> None:
    with stack.client() as c:
        for action_id, params in DEMO_CALLS.items():
            out = c.invoke(action_id, params)
            assert out.status == "completed", (action_id, out.stderr.text)
            assert out.exit_code == 0
            assert out.stdout.text
            assert out.connector_unauthorized is False  # the harness signed the catalog
            assert out.incidental_effects == ["disk-access-timestamp-update"]


def test_every_demo_action_runs_from_the_cli(stack: Stack) -> None:
    for action_id, params in DEMO_CALLS.items():
        args = [f"--param={k}={v}" for k, v in params.items()]
        res = stack.cli("invoke", action_id, *args)
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith("completed · exit 0")


def test_json_result_carries_only_declared_pointers(stack: Stack) -> None:
    with stack.client() as c:
        out = c.invoke("demo.fs.stat", {"path": "/etc/hostname"})
    assert out.result is not None
    assert out.result.json["bytes"] == os.stat("/etc/hostname").st_size
    assert set(out.result.pointers) == {"bytes", "mtime_s"}
    assert out.argv[-2:] == ["--", "/etc/hostname"]


def test_result_contract_failures_are_coded(stack: Stack) -> None:
    with stack.client() as c:
        bad = c.invoke("test.json", {"text": "not json"})
        missing = c.invoke("test.json", {"text": '{"b": 1}'})
        good = c.invoke("test.json", {"text": '{"a": 1, "b": 2}'})
    assert bad.status == "failed"
    assert [d.code for d in bad.diagnostics] == ["result-schema-invalid"]
    assert missing.status == "failed"
    assert [d.code for d in missing.diagnostics] == ["result-pointer-missing"]
    assert good.status == "completed" and good.result is not None
    assert good.result.pointers == {"a": 1}


def test_nonzero_exit_is_a_failed_outcome_not_an_error(stack: Stack) -> None:
    with stack.client() as c:
        out = c.invoke("test.exit", {"code": 3})
    assert out.status == "failed" and out.exit_code == 3
    assert out.stderr.text == "exiting\n"


def test_rejections_name_code_and_path(stack: Stack) -> None:
    with stack.client() as c:
        with pytest.raises(ActionNotAllowlisted) as unknown:
            c.invoke("no.such.action", {})
        with pytest.raises(ParametersInvalid) as missing:
            c.invoke("demo.fs.read-head", {"path": "/etc/hostname"})
        with pytest.raises(ParametersInvalid) as extra:
            c.invoke("demo.fs.stat", {"path": "/etc/hostname", "shell": "yes"})
        with pytest.raises(ParametersInvalid) as typed:
            c.invoke("demo.fs.read-head", {"path": "/etc/hostname", "lines": "3; reboot"})
    assert unknown.value.code == "action-not-allowlisted"
    assert missing.value.path == "$.parameters.lines"
    assert extra.value.path == "$.parameters"
    assert "shell" in extra.value.message
    assert typed.value.path == "$.parameters.lines"


def test_async_mode_on_a_sync_only_action_is_refused(stack: Stack) -> None:
    directive = new_directive(
        "demo.system.uptime", issuer=Issuer(module_id="sensorium.tests"), mode="async"
    )
    endpoint = core_endpoint(state_dir=str(stack.paths.root))
    with SyncRpcClient(endpoint, name="core") as rpc:
        res = rpc.call(Invoke(request_id=new_id(), directive=directive), DirectiveResult, 5.0)
    # A refusal at admission is the directive's `rejected` result, with its code.
    assert res.status == "rejected" and res.observation_ids == [] and res.result is None
    assert res.diagnostics[0].code == "execution-mode-unsupported"
    assert res.diagnostics[0].path == "$.timing.mode"


def test_cli_reports_rejection_with_exit_2(stack: Stack) -> None:
    res = stack.cli("invoke", "demo.fs.stat", "--param", "path=relative")
    assert res.returncode == 2
    assert "parameters-invalid" in res.stderr and "$.parameters.path" in res.stderr


def test_every_directive_is_in_the_audit_store(stack: Stack) -> None:
    with stack.client() as c:
        ok = c.invoke("demo.system.uptime")
        with pytest.raises(ActionNotAllowlisted):
            c.invoke("no.such.action")
    # Outcomes are durable before the reply; rejections are queued and land within moments.
    db = apsw.Connection(str(stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY)
    deadline = time.monotonic() + 5
    while True:
        rows = db.execute("SELECT record_id, kind, status, code FROM records").fetchall()
        if any(r[1] == "rejection" for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (ok.outcome_id, "outcome", "completed", None) in rows
    assert any(r[1] == "rejection" and r[3] == "action-not-allowlisted" for r in rows)
    log = (stack.paths.logs / "core.jsonl").read_text().splitlines()
    finished = [json.loads(x) for x in log if '"directive.finished"' in x]
    assert any(e["receipt"] == f"outcome:{ok.outcome_id}" for e in finished)
    # A compact line: a receipt reference, never the outcome body.
    assert all("stdout" not in e for e in finished)


def test_a_refusal_at_admission_is_answered_and_recorded_alike_on_either_way(
    stack: Stack,
) -> None:
    """An unkeyed, unsigned directive for an action this node does not have is refused in
    core's receive loop (Directives.refused_at_once); a keyed one, and one whose
    parameters are wrong, go through on_invoke. Each gets the same kind of coded answer
    naming its record, the record, and one log line that names the request."""
    with stack.client() as c:
        with pytest.raises(ActionNotAllowlisted) as quick:
            c.invoke("no.such.action.quick", {})
        with pytest.raises(ActionNotAllowlisted) as keyed:
            c.invoke("no.such.action.keyed", {}, idempotency_key="refusal-either-way")
        with pytest.raises(ParametersInvalid) as params:
            c.invoke("demo.fs.stat", {"path": "/etc/hostname", "shell": "yes"})
    for err in (quick.value, keyed.value):
        assert err.code == "action-not-allowlisted" and err.path == "$.action_id"
        assert "is not an action of this node's catalog" in err.message
    assert params.value.path == "$.parameters"
    ids = [e.value.detail["outcome/id"] for e in (quick, keyed, params)]
    db = apsw.Connection(str(stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY)
    deadline = time.monotonic() + 5
    while True:
        found = {
            r[0]: (r[1], r[2])
            for r in db.execute(
                "SELECT record_id, kind, code FROM records WHERE record_id IN (?, ?, ?)", ids
            )
        }
        if len(found) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert found[ids[0]] == found[ids[1]] == ("rejection", "action-not-allowlisted")
    assert found[ids[2]] == ("rejection", "parameters-invalid")
    log = [
        json.loads(x)
        for x in (stack.paths.logs / "core.jsonl").read_text().splitlines()
        if '"directive.rejected"' in x
    ]
    lines = {e["receipt"]: e for e in log}
    for outcome_id in ids:
        line = lines[f"outcome:{outcome_id}"]
        assert line["request/id"] and line["directive/id"] and line["code"]


def test_actions_lists_the_catalog_grouped(stack: Stack) -> None:
    res = stack.cli("actions")
    assert res.returncode == 0, res.stderr
    assert "demo.filesystem" in res.stdout and "demo.fs.read-head" in res.stdout
    assert "Prints the first lines of a file." in res.stdout


def test_one_slow_action_does_not_delay_another(stack: Stack) -> None:
    async def main() -> float:
        async with AsyncClient(state_dir=str(stack.paths.root)) as c:
            t0 = time.monotonic()
            slow = asyncio.create_task(c.invoke("test.sleep", {"seconds": 3}))
            await asyncio.to_thread(stack.action_pid, "sleep.py", 60)  # it runs
            fast = await c.invoke("demo.system.uptime")
            assert fast.status == "completed"
            # Answered while the slow one still runs, not queued behind it.
            assert not slow.done()
            out = await slow
            assert out.status == "completed"
            return time.monotonic() - t0

    assert asyncio.run(main()) >= 3.0


def test_many_concurrent_directives_each_get_their_own_outcome(stack: Stack) -> None:
    async def main() -> None:
        async with AsyncClient(state_dir=str(stack.paths.root)) as c:
            values = [f"v{i}" for i in range(40)]
            outs = await asyncio.gather(*(c.invoke("test.echo-args", {"value": v}) for v in values))
            assert [json.loads(o.stdout.text) for o in outs] == [["--", v] for v in values]

    asyncio.run(main())


def test_logs_command_merges_processes(stack: Stack) -> None:
    with stack.client() as c:
        c.invoke("demo.system.uptime")
    res = stack.cli("logs", "-n", "500")
    assert res.returncode == 0
    procs = {line.split()[1] for line in res.stdout.splitlines() if line[:2].isdigit()}
    assert {"core", "connector", "poller", "supervisor"} <= procs
    filtered = stack.cli("logs", "--process", "core", "--event", "directive.", "--json")
    events = [json.loads(x) for x in filtered.stdout.splitlines()]
    assert events and all(e["process"] == "core" for e in events)
    assert all("request/id" in e for e in events)


# --- the published directive contract, live -------------------------------------------


def _raw_call(stack: Stack, request: dict[str, Any]) -> dict[str, Any]:
    """One request as another language's client sends it: a DEALER and a MessagePack map."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(core_endpoint(state_dir=str(stack.paths.root)))
        sock.send(msgspec.msgpack.encode(request))
        assert sock.poll(30_000), "no reply from core"
        reply: dict[str, Any] = msgspec.msgpack.decode(sock.recv())
    finally:
        sock.close()
    assert reply["request/id"] == request["request/id"]
    return reply


def _directive_045(action_id: str) -> dict[str, Any]:
    """A directive shaped like proposal 045's: participant and node issuer, a deadline at
    the top level, evidence by reference, a delegated signature (verified: real keys),
    and a field this node does not know."""
    principal, proxy = Signer(), Signer()
    doc = {
        "schema": "sensorium-directive.v1",
        "schema/v": 1,
        "directive/id": new_id(),
        "directive/issued_at": rfc3339(),
        "issuer": {
            "participant/did:key": principal.participant,
            "module_id": "orbiplex.arca",
            "node_id": "node:" + Signer().did,
        },
        "action_id": action_id,
        "parameters": {},
        "evidence/inputs": [{"artifact/id": "sha256:9f86d081884c7d65", "role": "raw-capture"}],
        "timing": {"timeout_ms": 5000, "mode": "sync", "x-local": 1},
        "deadline_at": rfc3339(time.time() + 60),
        "correlation/id": "arca:run-7",
        "issuer_delegation": delegation(
            principal, proxy, {"sensorium.directive.invoke": [action_id]}, max_chain_depth=0
        ),
        "causal/context": {"parent": "a later upstream field"},
    }
    return signed(doc, proxy)


def test_directives_as_every_client_sends_them_are_contract_valid_and_served(
    stack: Stack,
) -> None:
    schema = json.loads(
        (importlib.resources.files("sensorium.schemas") / DIRECTIVE_SCHEMA).read_text("utf-8")
    )
    validator = jsonschema.Draft202012Validator(schema)
    with stack.client() as c:
        c.record_start("contract")
        assert c.invoke("demo.system.uptime", deadline_at=rfc3339(time.time() + 60)).status == (
            "completed"
        )

        async def via_aio() -> str:
            async with AsyncClient(state_dir=str(stack.paths.root), module_id="test.aio") as a:
                out = await a.invoke("demo.system.uptime", correlation_id="c-1")
                assert isinstance(out, Outcome)
                return out.status

        assert asyncio.run(via_aio()) == "completed"
        cli = stack.cli("invoke", "demo.system.uptime")
        assert cli.returncode == 0, cli.stderr

        # A directive valid against the published schema is served, extras and all.
        raw = _directive_045("demo.system.uptime")
        validator.validate(raw)
        reply = _raw_call(stack, {"method": INVOKE, "request/id": new_id(), "directive": raw})
        assert reply["ok"], reply["error"]
        assert reply["result"]["status"] == "completed"

        # Required stays required, and the refusal names what is missing.
        for missing in ("issuer", "directive/issued_at", "timing"):
            bad = {k: v for k, v in _directive_045("demo.system.uptime").items() if k != missing}
            reply = _raw_call(stack, {"method": INVOKE, "request/id": new_id(), "directive": bad})
            assert not reply["ok"] and reply["error"]["code"] == "request-malformed"
            assert missing in reply["error"]["message"], reply["error"]
        stopped = c.record_stop()

    with open(str(stopped.path), "rb") as fh:
        _header, entries = read_recording(fh)
        sent = [msgspec.msgpack.decode(e.request) for e in entries]
    directives = [r["directive"] for r in sent if r.get("method") == INVOKE]
    issuers = set()
    for d in directives:
        if d["directive/id"] == raw["directive/id"] or "issuer" not in d:
            continue
        if "directive/issued_at" not in d or "timing" not in d:
            continue
        validator.validate(d)
        assert None not in d.values() and None not in d["timing"].values()
        issuers.add(d["issuer"].get("module_id"))
    # The blocking client (the test process's name), the asyncio one, the CLI.
    assert {"test.aio", "sensorium.cli"} <= issuers and len(issuers) >= 3, issuers
