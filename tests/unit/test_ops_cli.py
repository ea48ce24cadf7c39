"""`sensorium ops` against a real registry file with no process running at all.

The operator view must work while core, the poller and the connector are down
(DESIGN §7): list and show read the registry, poll falls back to marking the
operation due, cancel to recording it in the registry. Each CLI call is a real
subprocess; independent ones run at once to keep the file fast.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from harness import SENSORIUM

from sensorium.shared.clock import rfc3339
from sensorium.shared.config import DeferredConfig
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.registry import Registry, Reservation
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.continuation import Caller, Continuation, ResumePoint
from sensorium.shared.wire.deferred import ConnectorDeferred

KIND = "sensorium.directive.invoke"
SECRET = "hunter2-do-not-print"
PRIVATE_OUTPUT = "PRIVATE-STDOUT-PAYLOAD"
REASON = "it sends a letter; a sent letter cannot be recalled"


@dataclass(frozen=True)
class Ids:
    running: str = "deferred:sensorium.directive.invoke:01RUNNING"
    uncancelable: str = "deferred:sensorium.directive.invoke:01NOCANCEL"
    stale: str = "deferred:sensorium.directive.invoke:01STALE"
    done: str = "deferred:sensorium.directive.invoke:01DONE"
    flow_step: str = "deferred:sensorium.directive.invoke:01FLOWSTEP"
    to_poll: str = "deferred:sensorium.directive.invoke:01TOPOLL"
    to_cancel: str = "deferred:sensorium.directive.invoke:01TOCANCEL"


IDS = Ids()


def _reservation(op_id: str, reason: str | None = None) -> Reservation:
    return Reservation(
        operation_id=op_id,
        operation_kind=KIND,
        owner_module_id="sensorium-os",
        capability_id=KIND,
        directive_id=f"d-{op_id[-8:]}",
        action_id="test.sleep",
        correlation_id=None,
        idempotency_key=None,
        deadline_at=None,
        preferred_ttl_s=None,
        preferred_retry_s=5.0,
        cancel_unavailable_reason=reason,
        audit_outcome_ref=f"outcome:{op_id[-8:]}",
        confirm_within_s=15.0,
    )


def _admit(reg: Registry, op_id: str, now: float, reason: str | None = None) -> None:
    reg.reserve(_reservation(op_id, reason), now)
    ack = ConnectorDeferred(
        operation_id=op_id,
        status="running",
        retry_after_seconds=5,
        created_at=rfc3339(now),
        cancel_href="connector" if reason is None else msgspec.UNSET,
        cancel_unavailable_reason=reason if reason is not None else msgspec.UNSET,
    )
    reg.confirm(op_id, ack, now)


def _populate(paths: StatePaths) -> None:
    reg = Registry(paths.registry_db, DeferredHostPolicy.from_config(DeferredConfig()))
    try:
        now = time.time()
        for op_id in (IDS.running, IDS.to_poll, IDS.to_cancel):
            _admit(reg, op_id, now)
        _admit(reg, IDS.uncancelable, now, REASON)
        # Admitted an hour ago: past its 15-minute expiry, and no poller recorded that.
        _admit(reg, IDS.stale, now - 3600)
        _admit(reg, IDS.done, now)
        outcome = {
            "status": "completed",
            "exit_code": 0,
            "outcome/id": "01OUTCOME",
            "stdout": {"text": PRIVATE_OUTPUT},
        }
        reg.settle(IDS.done, "completed", msgspec.msgpack.encode(outcome), None, None, now)
        context = {"api_token": SECRET, "count": 3}
        reg.flows.start(
            "run:01FLOW", "template:t", b"{}", context, "surface-to-caller", "core-a", now, 30.0
        )
        continuation = Continuation(
            continuation_id="continuation:01C",
            workflow_run_id="run:01FLOW",
            step_id="redact",
            deferred_operation_id=IDS.flow_step,
            resume_point=ResumePoint(
                template_id="template:t", step_index=1, step_id="redact", output_binding="draft"
            ),
            caller=Caller(module_id="sensorium-core.flow-runner"),
            capability_id=KIND,
            context=context,
        )
        reg.reserve(_reservation(IDS.flow_step), now, continuation)
    finally:
        reg.close()


@pytest.fixture(scope="module")
def node() -> Iterator[StatePaths]:
    # Short, because AF_UNIX socket paths are limited to 107 bytes.
    paths = StatePaths(Path(tempfile.mkdtemp(prefix="st-", dir="/tmp")))
    try:
        _populate(paths)
        yield paths
    finally:
        shutil.rmtree(paths.root, ignore_errors=True)


def _cli_all(*calls: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run the CLI calls at once (they are independent); their results in order."""
    procs = [
        subprocess.Popen(
            [*SENSORIUM, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for args in calls
    ]
    done = []
    try:
        for args, p in zip(calls, procs, strict=True):
            out, err = p.communicate(timeout=60)
            done.append(subprocess.CompletedProcess(args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def _registry(paths: StatePaths) -> Registry:
    return Registry(paths.registry_db, DeferredHostPolicy.from_config(DeferredConfig()))


def test_the_operator_view_reads_the_registry_with_nothing_running(node: StatePaths) -> None:
    state = str(node.root)
    listing, as_json, flow_step, done, unknown, empty = _cli_all(
        ["--state-dir", state, "ops", "list"],
        ["ops", "list", "--open", "--json", "--state-dir", state],
        ["ops", "show", IDS.flow_step, "--state-dir", state],
        ["ops", "show", IDS.done, "--json", "--state-dir", state],
        ["ops", "show", "deferred:nope", "--state-dir", state],
        ["ops", "list", "--state-dir", str(node.root / "never-started")],
    )
    assert listing.returncode == 0, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    assert set(lines) == set(vars(IDS).values())
    assert "running (expired, not yet recorded)" in lines[IDS.stale]
    assert "(expired" not in lines[IDS.running]
    assert "completed" in lines[IDS.done]
    assert "test.sleep" in lines[IDS.running] and "sensorium-os" in lines[IDS.running]

    assert as_json.returncode == 0, as_json.stderr
    open_ids = {o["operation/id"] for o in json.loads(as_json.stdout)["operations"]}
    assert IDS.done not in open_ids and IDS.running in open_ids

    assert flow_step.returncode == 0, flow_step.stderr
    text = flow_step.stdout
    assert "continuation:01C" in text and "run:01FLOW" in text and "redact" in text
    assert "api_token, count (values not shown)" in text
    assert "sha256:" in text and "sensorium-core.flow-runner" in text
    assert SECRET not in text and SECRET not in flow_step.stderr

    assert done.returncode == 0, done.stderr
    detail = json.loads(done.stdout)
    assert detail["result"]["status"] == "completed" and detail["result"]["exit_code"] == 0
    assert detail["result"]["digest"].startswith("sha256:")
    assert PRIVATE_OUTPUT not in done.stdout
    assert detail["continuation"] is None and detail["cancel_href"]

    assert unknown.returncode == 1
    assert "sensorium ops list" in unknown.stderr

    assert empty.returncode == 0 and "no deferred operations" in empty.stdout
    assert not (node.root / "never-started").exists()  # reading never creates a registry


def test_poll_and_cancel_fall_back_to_the_registry_when_core_is_down(node: StatePaths) -> None:
    state = str(node.root)
    before = time.time()
    poll, cancel, refused, cancel_unknown = _cli_all(
        ["ops", "poll", IDS.to_poll, "--state-dir", state],
        ["--state-dir", state, "ops", "cancel", IDS.to_cancel],
        ["ops", "cancel", IDS.uncancelable, "--state-dir", state],
        ["ops", "cancel", "deferred:nope", "--state-dir", state],
    )
    assert poll.returncode == 0, poll.stderr
    assert "marked due" in poll.stdout and "poller" in poll.stdout

    assert cancel.returncode == 0, cancel.stderr
    assert "owed a cancel" in cancel.stdout and "poller delivers" in cancel.stdout

    assert refused.returncode == 1
    assert REASON in refused.stdout

    assert cancel_unknown.returncode == 1 and "sensorium ops list" in cancel_unknown.stderr

    reg = _registry(node)
    try:
        polled = reg.require(IDS.to_poll)
        assert polled.status == "running" and polled.attempts == 0  # a poke is not a poll
        assert polled.next_poll_at is not None and polled.next_poll_at <= time.time()
        assert polled.next_poll_at >= before - 1
        cancelled = reg.require(IDS.to_cancel)
        assert cancelled.status == "cancelled" and cancelled.connector_cancel == "owed"
        kept = reg.require(IDS.uncancelable)
        assert kept.status == "running" and kept.connector_cancel is None
    finally:
        reg.close()


def test_refusals_before_any_request_exit_2(tmp_path: Path) -> None:
    bad_flow = tmp_path / "flow.json"
    bad_flow.write_text(json.dumps({"steps": [{"step_id": "a", "action_id": "x"}]}))
    state = str(tmp_path)
    wait_alone, flow_bad, flow_context = _cli_all(
        ["invoke", "test.sleep", "--wait", "--state-dir", state],
        ["flow", "run", str(bad_flow), "--state-dir", state],
        ["flow", "run", str(bad_flow), "--context", "[1]", "--state-dir", state],
    )
    assert wait_alone.returncode == 2 and "--wait needs --async" in wait_alone.stderr
    assert flow_bad.returncode == 2, flow_bad.stderr
    assert "flow-invalid" in flow_bad.stderr and "$.flow.steps[0]" in flow_bad.stderr
    assert flow_context.returncode == 2 and "$.context" in flow_context.stderr
