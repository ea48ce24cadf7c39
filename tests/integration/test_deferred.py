"""Deferred operations end to end: a real node, real jobs, the real poller.

The node polls at a 0.2 s host minimum so the suite stays quick; everything else is
the default host policy.
"""

from __future__ import annotations

import importlib.resources
import json
import time
from collections.abc import Iterator
from typing import Any

import apsw
import jsonschema
import msgspec
import pytest
from harness import (
    DEFER_PROFILE,
    Stack,
    deferrable_sleep,
    none_running,
    python_action,
    running_stack,
)

from sensorium.client import SensoriumError
from sensorium.shared.clock import parse_rfc3339
from sensorium.shared.wire.deferred import DeferredOperation

ACTIONS: list[dict[str, Any]] = [
    deferrable_sleep("test.defer.sleep"),
    deferrable_sleep("test.defer.only", execution_mode_support="async-only"),
    deferrable_sleep(
        "test.defer.keep",
        deferred_profile={
            **DEFER_PROFILE,
            "cancel/unavailable-reason": "the job must finish once begun",
        },
    ),
    deferrable_sleep(
        "test.defer.brief",
        deferred_profile={"preferred_retry_after_seconds": 1, "preferred_max_ttl_seconds": 2},
    ),
    python_action(
        "test.defer.exit",
        "exit_with.py",
        ["{{code}}"],
        {"code": {"type": "integer"}},
        execution_mode_support="either",
    ),
    python_action(
        "test.echo-args", "echo_args.py", ["--", "{{value}}"], {"value": {"type": "string"}}
    ),
]
NODE = {"deferred": {"min_retry_s": 0.2, "connector_max_running_jobs": 3}}


@pytest.fixture(scope="module")
def node() -> Iterator[Stack]:
    with running_stack(ACTIONS, node=NODE) as s:
        yield s


def _defer(node: Stack, action: str, params: dict[str, Any], **kw: Any) -> DeferredOperation:
    with node.client() as c:
        op = c.invoke(action, params, mode="async", **kw)
    assert isinstance(op, DeferredOperation)
    return op


def test_async_invoke_returns_a_handle_and_the_poller_completes_it(node: Stack) -> None:
    op = _defer(node, "test.defer.sleep", {"seconds": 1.01}, correlation_id="run:tour")
    assert op.status == "deferred" and op.operation_id.startswith("deferred:")
    assert op.cancelable and str(op.cancel_href).startswith("sensorium.operation.cancel")
    assert op.audit_outcome_ref is not None and op.audit_outcome_ref.startswith("outcome:")
    assert op.correlation_id == "run:tour"
    lifetime = parse_rfc3339(op.expires_at) - parse_rfc3339(op.created_at)
    # The smallest hint wins: the connector's fail-after (the 10 s budget, the SIGTERM
    # grace and a margin) is under the action's preferred 120 s and the host's 15 min.
    assert 15 <= lifetime <= 120.5
    with node.client() as c:
        assert c.status(op).status in ("pending", "running")
        final = c.wait(op, 30, include_result=True)
    assert final.status == "completed"
    assert final.result["exit_code"] == 0
    assert "woke" in final.result["stdout"]["text"]
    # The acceptance is in the audit store under the handle's reference.
    with apsw.Connection(str(node.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as db:
        kind = db.execute(
            "SELECT kind FROM records WHERE record_id = ?",
            (op.audit_outcome_ref.removeprefix("outcome:"),),
        ).fetchone()
    assert kind == ("deferral",)


def test_execution_mode_is_checked_before_dispatch(node: Stack) -> None:
    with node.client() as c:
        with pytest.raises(SensoriumError) as sync_only:
            c.invoke("test.echo-args", {"value": "x"}, mode="async")
        with pytest.raises(SensoriumError) as async_only:
            c.invoke("test.defer.only", {"seconds": 0.1})
        op = c.invoke("test.defer.only", {"seconds": 0.1}, mode="async")
        assert c.wait(op, 30).status == "completed"
    assert sync_only.value.code == async_only.value.code == "execution-mode-unsupported"
    assert sync_only.value.path == "$.timing.mode"


def test_an_idempotency_key_gives_one_operation(node: Stack) -> None:
    first = _defer(node, "test.defer.sleep", {"seconds": 0.2}, idempotency_key="k-defer-1")
    again = _defer(node, "test.defer.sleep", {"seconds": 0.2}, idempotency_key="k-defer-1")
    assert again.operation_id == first.operation_id
    with node.client() as c:
        assert c.wait(first, 30).status == "completed"


def test_a_failing_job_ends_failed_with_its_outcome(node: Stack) -> None:
    op = _defer(node, "test.defer.exit", {"code": 3})
    with node.client() as c:
        final = c.wait(op, 30, include_result=True)
    assert final.status == "failed"
    assert final.result["exit_code"] == 3


def test_cancel_running_stops_the_process(node: Stack) -> None:
    op = _defer(node, "test.defer.sleep", {"seconds": 30.301})
    node.action_pid("30.301")
    with node.client() as c:
        after = c.cancel(op)
        assert after.status == "cancelled"
        assert c.wait(op, 5).status == "cancelled"
    assert none_running("30.301", within_s=15)


def test_cancel_pending_never_starts_the_job(node: Stack) -> None:
    busy = [_defer(node, "test.defer.sleep", {"seconds": 30.4 + i / 100}) for i in range(3)]
    for i in range(3):
        node.action_pid(f"{30.4 + i / 100}")
    queued = _defer(node, "test.defer.sleep", {"seconds": 30.777})
    with node.client() as c:
        assert c.status(queued).status == "pending"
        assert c.cancel(queued).status == "cancelled"
        for op in busy:
            c.cancel(op)
    time.sleep(1.0)  # slots freed: a job that was still queued would start now
    assert none_running("30.777", within_s=0.1)
    for i in range(3):
        assert none_running(f"{30.4 + i / 100}", within_s=15)


def test_a_non_cancelable_operation_says_why(node: Stack) -> None:
    op = _defer(node, "test.defer.keep", {"seconds": 0.5})
    assert not op.cancelable
    assert op.cancel_unavailable_reason == "the job must finish once begun"
    with node.client() as c:
        with pytest.raises(SensoriumError) as refused:
            c.cancel(op)
        assert c.wait(op, 30).status == "completed"
    assert refused.value.code == "operation-not-cancelable"
    assert "must finish once begun" in refused.value.message
    res = node.cli("ops", "cancel", op.operation_id)
    assert res.returncode == 1 and "must finish once begun" in (res.stdout + res.stderr)


def test_expiry_ends_the_operation_and_cancels_the_job(node: Stack) -> None:
    op = _defer(node, "test.defer.brief", {"seconds": 30.909})
    expires = parse_rfc3339(op.expires_at)
    assert expires - parse_rfc3339(op.created_at) <= 2.001
    with node.client() as c:
        final = c.wait(op, 30)
    assert final.status == "expired"
    assert final.diagnostics and final.diagnostics[0].code == "operation-expired"
    assert final.updated_at is not None
    # Ended on time (the poller wakes for the expiry itself), not at some later poll.
    assert parse_rfc3339(final.updated_at) - expires < 1.5
    assert none_running("30.909", within_s=15)


def test_ops_cli_lists_and_shows_operations(node: Stack) -> None:
    op = _defer(node, "test.defer.sleep", {"seconds": 0.1})
    with node.client() as c:
        c.wait(op, 30)
    listing = node.cli("ops", "list")
    assert listing.returncode == 0, listing.stderr
    assert op.operation_id in listing.stdout
    shown = node.cli("ops", "show", op.operation_id)
    assert shown.returncode == 0, shown.stderr
    assert "completed" in shown.stdout


FLOW: dict[str, Any] = {
    "steps": [
        {
            "step_id": "greet",
            "action_id": "test.echo-args",
            "parameters": {"value": "${who}"},
            "output_binding": "greeting",
        },
        {
            "step_id": "wait",
            "action_id": "test.defer.sleep",
            "parameters": {"seconds": 0.3},
            "output_binding": "slept",
            "mode": "async",
        },
        {
            "step_id": "report",
            "action_id": "test.echo-args",
            "parameters": {"value": {"$eval": "'slept, exit ' + str(slept.exit_code)"}},
            "output_binding": "report",
        },
    ]
}


def test_a_flow_suspends_on_a_deferred_step_and_resumes_from_the_next(node: Stack) -> None:
    with node.client() as c:
        started = c.run_flow(FLOW, {"who": "operator"})
        assert started.state == "suspended" and started.step_index == 1
        assert started.deferred is not None  # surface-to-caller: the handle is the answer
        assert started.context["greeting"]["stdout"]["text"].strip() == '["--", "operator"]'
        done = c.wait_flow(started.flow_id, 30)
    assert done.state == "completed", done.diagnostics
    assert done.step_index == 3
    assert done.context["slept"]["exit_code"] == 0
    assert done.context["report"]["stdout"]["text"].strip() == '["--", "slept, exit 0"]'


def test_reject_as_failure_fails_a_deferring_step_before_dispatch(node: Stack) -> None:
    flow = {**FLOW, "deferred_response_mode": "reject-as-failure"}
    with node.client() as c:
        ops_before = {o.operation_id for o in c.operations(1000).operations}
        ended = c.run_flow(flow, {"who": "x"})
        ops_after = {o.operation_id for o in c.operations(1000).operations}
    assert ended.state == "failed"
    assert ended.diagnostics[0].code == "deferred-not-accepted"
    assert ended.step_index == 1
    assert ops_after == ops_before  # nothing was dispatched for the deferring step


def test_a_runaway_template_fails_its_flow_and_core_keeps_serving(node: Stack) -> None:
    heavy = {
        "$map": {"$eval": "range(0, 3000)"},
        "each(i)": {"$reduce": {"$eval": "range(0, 3000)"}, "initial": 0, "each(a, j)": "x"},
    }
    flow = {
        "steps": [
            {
                "step_id": "bad",
                "action_id": "test.echo-args",
                "parameters": heavy,
                "output_binding": "out",
            }
        ]
    }
    with node.client() as c:
        ended = c.run_flow(flow, {})
        assert c.health().process == "core"
    # Stopped by its counted render steps, not a clock: the same on every machine.
    assert ended.state == "failed", ended
    assert ended.diagnostics[0].code == "flow-invalid"
    assert "render budget" in ended.diagnostics[0].message, ended.diagnostics


def _project_validator(name: str) -> jsonschema.Draft202012Validator:
    text = (importlib.resources.files("sensorium.schemas") / f"{name}.schema.json").read_text(
        "utf-8"
    )
    return jsonschema.Draft202012Validator(json.loads(text))


def test_handle_and_statuses_from_a_live_node_are_contract_valid(node: Stack) -> None:
    handle_schema = _project_validator("deferred-operation.v1")
    status_schema = _project_validator("deferred-operation-status.v1")
    op = _defer(node, "test.defer.sleep", {"seconds": 0.6})
    handle = json.loads(msgspec.json.encode(op))
    handle_schema.validate(handle)
    # Seed 002's recommended fields ride under extensions; nothing is null.
    assert handle["extensions"]["owner_module_id"] and handle["extensions"]["capability_id"]
    assert None not in handle.values()
    seen: dict[str, dict[str, Any]] = {}
    with node.client() as c:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = c.status(op)
            doc = json.loads(msgspec.json.encode(status))
            seen.setdefault(status.status, doc)
            if status.terminal:
                break
            time.sleep(0.05)
        seen["completed+raw"] = json.loads(msgspec.json.encode(c.status(op, include_result=True)))
        seen["cancel-of-final"] = json.loads(msgspec.json.encode(c.cancel(op)))
    assert "completed" in seen and ({"pending", "running"} & set(seen)), set(seen)
    for state, doc in seen.items():
        status_schema.validate(doc)
        assert None not in doc.values(), (state, doc)
        assert "attempt_no" not in doc and "attempt_no" in doc.get("extensions", {})
        if doc["status"] == "completed":
            assert "retry_after_seconds" not in doc and isinstance(doc["result"], dict)
        else:
            assert doc["retry_after_seconds"] >= 1 and "result" not in doc
