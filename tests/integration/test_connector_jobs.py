"""Deferred jobs in the OS connector, driven over its seam on a real running node:
acknowledgement before the work ends, status with the outcome, idempotent ids,
execution modes, cancel (waiting, running, refused), and the truth after restarts."""

from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from harness import Stack, gone, ignoring_sigterm, python_action, start_stack

from sensorium.shared.config import connector_endpoint, load_node_config
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.deferred import ConnectorDeferred, DeferredOperationStatus
from sensorium.shared.wire.directive import Issuer, TimingMode, new_directive
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.report import ModuleReport
from sensorium.shared.wire.seam import (
    ConnectorCancel,
    ConnectorInvoke,
    ConnectorReport,
    ConnectorStatus,
)

GRACE_S = 1.0
PROFILE = {"preferred_retry_after_seconds": 2, "preferred_max_ttl_seconds": 120}
REASON = "it hands its input to a printer that cannot take it back"
SECONDS = {"seconds": {"type": "number"}}
VALUE = {"value": {"type": "string"}}


def _either(
    action_id: str, script: str, argv: list[str], props: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A test action that may run as a deferred job."""
    extra.setdefault("execution_mode_support", "either")
    extra.setdefault("deferred_profile", PROFILE)
    return python_action(action_id, script, argv, props, **extra)


ACTIONS = [
    _either("job.sleep", "sleep.py", ["{{seconds}}"], SECONDS),
    _either("job.stubborn", "stubborn.py", ["{{seconds}}"], SECONDS),
    _either("job.echo", "echo_args.py", ["--", "{{value}}"], VALUE),
    _either(
        "job.keep",
        "sleep.py",
        ["{{seconds}}"],
        SECONDS,
        deferred_profile={**PROFILE, "cancel/unavailable-reason": REASON},
    ),
    _either(
        "job.later", "echo_args.py", ["--", "{{value}}"], VALUE, execution_mode_support="async-only"
    ),
    python_action("job.now", "echo_args.py", ["--", "{{value}}"], VALUE),
]
# One slot and two places in the queue: waiting and a full queue are easy to reach.
NODE = {
    "deferred": {"connector_max_running_jobs": 1, "connector_max_pending_jobs": 2},
    "limits": {"sigterm_grace_s": GRACE_S},
}


@pytest.fixture(scope="module")
def node() -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    s = start_stack(StatePaths(root), ACTIONS, NODE)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()
        if not os.environ.get("KEEP"):
            shutil.rmtree(root, ignore_errors=True)


class Seam:
    """Core's side of the connector seam, as a test drives it."""

    def __init__(self, stack: Stack) -> None:
        endpoint = connector_endpoint(load_node_config(stack.paths), stack.paths)
        self.client = SyncRpcClient(
            endpoint, name="connector", unavailable_code=RuntimeErrorCode.CONNECTOR_UNAVAILABLE
        )
        self.config_hash = self.client.call(
            ConnectorReport(request_id=new_id()), ModuleReport, 5.0
        ).config_hash

    def close(self) -> None:
        self.client.close()

    def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any],
        *,
        mode: TimingMode = "async",
        op: str | None = None,
        directive_id: str | None = None,
        timeout_ms: int = 10_000,
    ) -> Any:
        directive = new_directive(
            action_id,
            parameters,
            issuer=Issuer(module_id="sensorium.tests"),
            mode=mode,
            directive_id=directive_id,
        )
        req = ConnectorInvoke(
            request_id=new_id(),
            directive=directive,
            timeout_ms=timeout_ms,
            config_hash=self.config_hash,
            operation_id=op,
        )
        reply: type[Any] = ConnectorDeferred if mode == "async" else Outcome
        return self.client.call(req, reply, 10.0)

    def submit(self, action_id: str, parameters: dict[str, Any], **kw: Any) -> ConnectorDeferred:
        ack = self.invoke(action_id, parameters, op=kw.pop("op", None) or op_id(), **kw)
        assert isinstance(ack, ConnectorDeferred)
        return ack

    def status(self, op: str) -> DeferredOperationStatus:
        req = ConnectorStatus(request_id=new_id(), operation_id=op)
        return self.client.call(req, DeferredOperationStatus, 5.0)

    def cancel(self, op: str) -> DeferredOperationStatus:
        req = ConnectorCancel(request_id=new_id(), operation_id=op)
        return self.client.call(req, DeferredOperationStatus, 10.0)

    def wait_final(self, op: str, within_s: float = 10.0) -> DeferredOperationStatus:
        deadline = time.monotonic() + within_s
        while True:
            st = self.status(op)
            if st.terminal or time.monotonic() > deadline:
                return st
            time.sleep(0.05)

    def wait_status(self, op: str, status: str, within_s: float = 10.0) -> None:
        deadline = time.monotonic() + within_s
        while self.status(op).status != status:
            assert time.monotonic() < deadline, f"{op} never became {status}"
            time.sleep(0.05)


@pytest.fixture
def seam(node: Stack) -> Iterator[Seam]:
    s = Seam(node)
    try:
        yield s
    finally:
        s.close()


def op_id() -> str:
    return f"deferred:sensorium.directive.invoke:{new_id()}"


def codes(st: DeferredOperationStatus) -> list[str]:
    return [d.code for d in st.diagnostics]


def test_the_ack_comes_before_the_work_ends_and_status_carries_the_outcome(seam: Seam) -> None:
    ack = seam.submit("job.sleep", {"seconds": 1.5})
    assert ack.status in ("pending", "running")
    assert ack.schema == "sensorium-connector-deferred.v1"
    assert ack.cancel_href == "sensorium.connector.cancel" and ack.cancelable
    assert ack.retry_after_seconds == PROFILE["preferred_retry_after_seconds"]
    if ack.status == "running":  # it had the free slot: its end is known
        assert ack.fail_after_seconds == math.ceil(10 + GRACE_S) + 5
    st = seam.status(ack.operation_id)
    assert st.status in ("pending", "running") and st.result is msgspec.UNSET
    assert st.retry_after_seconds == PROFILE["preferred_retry_after_seconds"]
    final = seam.wait_final(ack.operation_id)
    assert final.status == "completed", final
    assert final.updated_at is not None and not final.diagnostics
    outcome = final.result
    assert outcome["schema"] == "sensorium-os-execution.v1"
    assert outcome["status"] == "completed" and outcome["exit_code"] == 0
    assert outcome["action_id"] == "job.sleep"
    assert "woke" in outcome["stdout"]["text"]


def test_an_operation_id_names_one_job_however_often_it_is_submitted(seam: Seam) -> None:
    op, directive_id = op_id(), new_id()
    first = seam.submit("job.echo", {"value": "once"}, op=op, directive_id=directive_id)
    again = seam.submit("job.echo", {"value": "once"}, op=op, directive_id=directive_id)
    assert again.created_at == first.created_at
    done = seam.wait_final(op)
    assert done.status == "completed"
    later = seam.submit("job.echo", {"value": "once"}, op=op, directive_id=directive_id)
    assert later.status == "completed" and later.created_at == first.created_at
    assert seam.status(op).result["outcome/id"] == done.result["outcome/id"]
    with pytest.raises(CodedError) as exc:
        seam.submit("job.echo", {"value": "other"}, op=op)
    assert exc.value.code == RuntimeErrorCode.IDEMPOTENCY_CONFLICT


def test_execution_modes_are_enforced_at_the_connector(seam: Seam) -> None:
    with pytest.raises(CodedError) as exc:
        seam.submit("job.now", {"value": "x"})
    assert exc.value.code == RuntimeErrorCode.EXECUTION_MODE_UNSUPPORTED
    with pytest.raises(CodedError) as exc:
        seam.invoke("job.later", {"value": "x"}, mode="sync")
    assert exc.value.code == RuntimeErrorCode.EXECUTION_MODE_UNSUPPORTED
    with pytest.raises(CodedError) as exc:
        seam.invoke("job.echo", {"value": "x"})  # async without an operation/id
    assert exc.value.code == RuntimeErrorCode.REQUEST_MALFORMED
    # The sync path still runs sync actions, and either-actions both ways.
    out = seam.invoke("job.now", {"value": "now"}, mode="sync")
    assert out.status == "completed" and "now" in out.stdout.text
    assert seam.invoke("job.echo", {"value": "x"}, mode="sync").status == "completed"
    later = seam.submit("job.later", {"value": "later"})
    assert seam.wait_final(later.operation_id).status == "completed"
    # An id nobody submitted is unknown, to status and cancel alike.
    assert seam.status(op_id()).status == "unknown"
    assert seam.cancel(op_id()).status == "unknown"


def test_cancel_stops_a_waiting_job_and_kills_a_running_one(node: Stack, seam: Seam) -> None:
    running = seam.submit("job.sleep", {"seconds": 31.25})
    seam.wait_status(running.operation_id, "running")
    pid = node.action_pid("sleep.py 31.25")
    waiting = seam.submit("job.echo", {"value": "never"})
    assert waiting.status == "pending"
    assert waiting.fail_after_seconds is msgspec.UNSET  # it waits for a slot
    queued = seam.submit("job.echo", {"value": "queued"})
    with pytest.raises(CodedError) as exc:  # the queue holds two
        seam.submit("job.echo", {"value": "one too many"})
    assert exc.value.code == RuntimeErrorCode.OVERLOADED and exc.value.retry_after_ms

    st = seam.cancel(waiting.operation_id)
    assert st.status == "cancelled" and st.result is msgspec.UNSET
    assert seam.cancel(queued.operation_id).status == "cancelled"

    t0 = time.monotonic()
    st = seam.cancel(running.operation_id)
    assert st.status == "cancelled"
    assert time.monotonic() - t0 < GRACE_S + 3
    assert gone(pid, 10), "the cancelled job's process outlived its cancel"  # it sleeps 31 s
    # Final stays final; the cancelled waiting job never ran.
    assert seam.cancel(running.operation_id).status == "cancelled"
    assert seam.status(waiting.operation_id).status == "cancelled"
    # The slot is free again.
    after = seam.submit("job.echo", {"value": "after"})
    assert seam.wait_final(after.operation_id).status == "completed"


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(node: Stack, seam: Seam) -> None:
    ack = seam.submit("job.stubborn", {"seconds": 34.5})
    seam.wait_status(ack.operation_id, "running")
    pid = node.action_pid("stubborn.py 34.5")
    ignoring_sigterm(pid, 60)
    t0 = time.monotonic()
    st = seam.cancel(ack.operation_id)
    took = time.monotonic() - t0
    assert st.status == "cancelled"
    assert GRACE_S * 0.9 <= took < GRACE_S + 3
    assert gone(pid, 10)  # it sleeps 34.5 s


def test_a_non_cancelable_job_says_why(seam: Seam) -> None:
    ack = seam.submit("job.keep", {"seconds": 0.5})
    assert ack.cancel_unavailable_reason == REASON and not ack.cancelable
    with pytest.raises(CodedError) as exc:
        seam.cancel(ack.operation_id)
    assert exc.value.code == RuntimeErrorCode.OPERATION_NOT_CANCELABLE
    assert REASON in exc.value.message
    assert seam.wait_final(ack.operation_id).status == "completed"


def test_jobs_tell_the_truth_across_a_connector_restart(node: Stack, seam: Seam) -> None:
    done = seam.submit("job.echo", {"value": "kept"})
    assert seam.wait_final(done.operation_id).status == "completed"
    cut = seam.submit("job.sleep", {"seconds": 32.5})
    seam.wait_status(cut.operation_id, "running")
    pid = node.action_pid("sleep.py 32.5")
    waiting = seam.submit("job.echo", {"value": "after the restart"})
    seam.close()

    old = node.pids()["connector"]
    res = node.cli("restart", "connector")
    assert res.returncode == 0, res.stdout + res.stderr
    node.wait_replaced("connector", old)
    assert gone(pid, 10)  # it sleeps 32.5 s

    seam2 = Seam(node)
    try:
        kept = seam2.status(done.operation_id)
        assert kept.status == "completed" and "kept" in kept.result["stdout"]["text"]
        stopped = seam2.status(cut.operation_id)
        assert stopped.status == "failed"
        assert codes(stopped) == [RuntimeErrorCode.SHUTTING_DOWN]
        # Signalled at once by the stopping connector, and its stderr says so (ADR-008).
        assert stopped.result["stderr"]["text"].endswith(
            "process interrupted by signal SIGTERM\n"
        ), stopped.result
        # The job that waited runs once the connector is back.
        resumed = seam2.wait_final(waiting.operation_id)
        assert resumed.status == "completed"
        assert "after the restart" in resumed.result["stdout"]["text"]
    finally:
        seam2.close()


def test_a_job_whose_connector_was_killed_ends_job_lost(node: Stack) -> None:
    seam = Seam(node)
    try:
        ack = seam.submit("job.sleep", {"seconds": 33.75})
        seam.wait_status(ack.operation_id, "running")
        pid = node.action_pid("sleep.py 33.75")
    finally:
        seam.close()
    old = node.pids()["connector"]
    assert old is not None
    os.kill(old, signal.SIGKILL)
    node.wait_replaced("connector", old)
    assert gone(pid, 10)  # it sleeps 33.75 s
    seam = Seam(node)
    try:
        st = seam.status(ack.operation_id)
        assert st.status == "failed" and st.result is msgspec.UNSET
        assert codes(st) == [RuntimeErrorCode.JOB_LOST]
        assert "not known" in st.diagnostics[0].message
    finally:
        seam.close()
