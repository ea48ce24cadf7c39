"""Directives end to end through real processes: CLI, Python client, rejections, audit."""

from __future__ import annotations

import asyncio
import json
import os
import time

import apsw
import pytest
from harness import Stack

from sensorium.client import ActionNotAllowlisted, AsyncClient, ParametersInvalid
from sensorium.client.endpoint import core_endpoint
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.directive import Directive, Timing
from sensorium.shared.wire.outcome import Outcome

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
    directive = Directive(
        directive_id=new_id(), action_id="demo.system.uptime", timing=Timing(mode="async")
    )
    endpoint = core_endpoint(state_dir=str(stack.paths.root))
    with SyncRpcClient(endpoint, name="core") as rpc, pytest.raises(CodedError) as err:
        rpc.call(Invoke(request_id=new_id(), directive=directive), Outcome, 5.0)
    assert err.value.code == "execution-mode-unsupported"
    assert err.value.path == "$.timing.mode"


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


def test_actions_lists_the_catalog_grouped(stack: Stack) -> None:
    res = stack.cli("actions")
    assert res.returncode == 0, res.stderr
    assert "demo.filesystem" in res.stdout and "demo.fs.read-head" in res.stdout
    assert "Prints the first lines of a file." in res.stdout


def test_one_slow_action_does_not_delay_another(stack: Stack) -> None:
    async def main() -> tuple[float, float]:
        async with AsyncClient(state_dir=str(stack.paths.root)) as c:
            t0 = time.monotonic()
            slow = asyncio.create_task(c.invoke("test.sleep", {"seconds": 3}))
            await asyncio.sleep(0.2)
            fast = await c.invoke("demo.system.uptime")
            fast_at = time.monotonic() - t0
            assert fast.status == "completed"
            out = await slow
            assert out.status == "completed"
            return fast_at, time.monotonic() - t0

    fast_at, slow_at = asyncio.run(main())
    assert fast_at < 2.0 < slow_at


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
