"""Continuations: a suspended flow is resumed exactly once, whoever completes its step.

The race is real: two OS processes, each with its own ``Registry`` on the same SQLite
file, settle the same 200 operations as ``completed`` at the same time. Exactly one
settle per operation may report ``changed``, and each flow must carry exactly the
winner's result, time and step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sensorium.shared.deferred.continuations import FlowStore, digest, encode
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.registry import Registry, Reservation
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.wire.continuation import Caller, Continuation, ResumePoint
from sensorium.shared.wire.deferred import ConnectorDeferred

T0 = 1_700_000_000.0
POLICY = DeferredHostPolicy(1.0, 60.0, 900.0, 5, 0.2)
CORE = "core:test"
LEASE_S = 60.0
RESUME_AT_STEP = 3
BINDING = "sensorium_result"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "storage" / "deferred-operations.sqlite"


@pytest.fixture
def reg(db: Path) -> Registry:
    return Registry(db, POLICY)


def _continuation(op_id: str, flow_id: str) -> Continuation:
    return Continuation(
        continuation_id=f"continuation:{op_id}",
        workflow_run_id=flow_id,
        step_id="call_sensorium_directive",
        deferred_operation_id=op_id,
        resume_point=ResumePoint(
            template_id="template:t",
            step_index=RESUME_AT_STEP,
            step_id="call_sensorium_directive",
            output_binding=BINDING,
        ),
        caller=Caller(module_id="sensorium-core.flow-runner"),
        capability_id="sensorium.directive.invoke",
        context={"seed": flow_id, "earlier": [1, 2, 3]},
        trace={"correlation/id": flow_id},
        idempotency_key=f"flow:{flow_id}:{RESUME_AT_STEP}",
        deadline_at="2023-11-15T00:00:00Z",
    )


def _reservation(op_id: str) -> Reservation:
    return Reservation(
        operation_id=op_id,
        operation_kind="sensorium.directive.invoke",
        owner_module_id="sensorium-os",
        capability_id="sensorium.directive.invoke",
        directive_id=f"d:{op_id}",
        action_id="demo.slow.job",
        correlation_id=None,
        idempotency_key=None,
        deadline_at=None,
        preferred_ttl_s=None,
        preferred_retry_s=None,
        cancel_unavailable_reason=None,
        audit_outcome_ref="outcome:x",
        confirm_within_s=15.0,
    )


def _start(store: FlowStore, flow_id: str, now: float = T0) -> None:
    store.start(
        flow_id, "template:t", b"{}", {"seed": flow_id}, "surface-to-caller", CORE, now, LEASE_S
    )


def suspended(reg: Registry, i: int, now: float = T0, *, started: bool = False) -> tuple[str, str]:
    """A flow suspended on an admitted operation: (operation id, flow id)."""
    op_id, flow_id = f"deferred:sensorium.directive.invoke:{i:04d}", f"run:{i:04d}"
    if not started:
        _start(reg.flows, flow_id, now)
    reg.reserve(_reservation(op_id), now, _continuation(op_id, flow_id))
    reg.confirm(
        op_id,
        ConnectorDeferred(
            operation_id=op_id,
            status="running",
            created_at="2023-11-14T22:13:20Z",
            cancel_href=f"sensorium.connector.cancel?operation/id={op_id}",
        ),
        now,
    )
    return op_id, flow_id


def _continuation_row(reg: Registry, op_id: str) -> tuple[Any, ...]:
    rows = reg.conn.execute(
        "SELECT continuation_id, flow_id, digest, resumed_at FROM continuations "
        "WHERE operation_id = ?",
        (op_id,),
    ).fetchall()
    assert len(rows) == 1, rows
    return tuple(rows[0])


# -- suspend and resume ----------------------------------------------------------------


def test_reserve_with_a_continuation_suspends_the_flow(reg: Registry) -> None:
    op_id, flow_id = suspended(reg, 1)
    flow = reg.flows.get(flow_id)
    assert flow is not None
    assert flow.state == "suspended" and flow.operation_id == op_id
    assert flow.context == {"seed": flow_id, "earlier": [1, 2, 3]}
    cid, fid, dig, resumed_at = _continuation_row(reg, op_id)
    assert (cid, fid, resumed_at) == (f"continuation:{op_id}", flow_id, None)
    body, stored_digest, _ = reg.flows.continuation_of(op_id) or (b"", "", None)
    assert stored_digest == dig == digest(body)
    assert body == encode(_continuation(op_id, flow_id))
    assert msgspec.json.decode(body, type=Continuation) == _continuation(op_id, flow_id)


def test_completed_resumes_the_flow_at_the_next_step(reg: Registry) -> None:
    op_id, flow_id = suspended(reg, 1)
    result = {"status": "completed", "result": {"json": {"redacted_text": "…"}}}
    s = reg.settle(op_id, "completed", msgspec.msgpack.encode(result), None, None, T0 + 7)
    assert s.changed and s.resumed_flow == flow_id
    flow = reg.flows.get(flow_id)
    assert flow is not None
    assert flow.state == "runnable"
    assert flow.step_index == RESUME_AT_STEP + 1
    assert flow.context == {"seed": flow_id, "earlier": [1, 2, 3], BINDING: result}
    assert flow.operation_id is None and flow.updated_at == T0 + 7
    assert _continuation_row(reg, op_id)[3] == T0 + 7
    again = reg.settle(op_id, "completed", msgspec.msgpack.encode({"x": 1}), None, None, T0 + 8)
    assert not again.changed and again.resumed_flow is None
    assert reg.flows.get(flow_id) == flow


@pytest.mark.parametrize(
    ("status", "code", "message", "expected_code"),
    [
        ("failed", "action-failed", "exit 3", "action-failed"),
        ("failed", None, None, RuntimeErrorCode.FLOW_STEP_FAILED),
        ("unknown", "operation-unknown", "the connector forgot it", "operation-unknown"),
        ("timed-out", "action-timeout", "ran past 5000 ms", "action-timeout"),
    ],
)
def test_a_non_completed_end_fails_the_flow_with_a_code(
    reg: Registry, status: str, code: str | None, message: str | None, expected_code: str
) -> None:
    op_id, flow_id = suspended(reg, 1)
    s = reg.settle(op_id, status, None, code, message, T0 + 3)
    assert s.changed and s.resumed_flow == flow_id
    flow = reg.flows.get(flow_id)
    assert flow is not None
    assert flow.state == "failed" and flow.last_code == expected_code
    assert flow.last_diagnostic is not None
    assert flow.last_diagnostic.startswith(f"step 'call_sensorium_directive' ended {status}")
    if message:
        assert message in flow.last_diagnostic
    assert flow.step_index == 0 and BINDING not in flow.context


def test_cancel_expire_and_exhaustion_fail_the_flow(reg: Registry) -> None:
    cancelled, f1 = suspended(reg, 1)
    expired, f2 = suspended(reg, 2)
    exhausted, f3 = suspended(reg, 3)
    assert reg.cancel(cancelled, T0 + 1).resumed_flow == f1
    assert reg.expire(expired, T0 + 900).resumed_flow == f2
    for n in range(POLICY.max_attempts):
        last = reg.record_open(exhausted, None, "running", None, T0 + n)
    assert last.resumed_flow == f3
    codes = {}
    for flow_id in (f1, f2, f3):
        flow = reg.flows.get(flow_id)
        assert flow is not None and flow.state == "failed"
        codes[flow_id] = flow.last_code
    assert codes == {
        f1: RuntimeErrorCode.FLOW_STEP_FAILED,
        f2: RuntimeErrorCode.OPERATION_EXPIRED,
        f3: RuntimeErrorCode.POLL_ATTEMPTS_EXHAUSTED,
    }


def test_an_operation_without_a_continuation_resumes_nothing(reg: Registry) -> None:
    reg.reserve(_reservation("deferred:plain"), T0)
    s = reg.settle("deferred:plain", "completed", None, None, None, T0 + 1)
    assert s.changed and s.resumed_flow is None


def test_withdraw_drops_the_continuation(reg: Registry) -> None:
    op_id, flow_id = "deferred:w", "run:w"
    _start(reg.flows, flow_id)
    reg.reserve(_reservation(op_id), T0, _continuation(op_id, flow_id))
    assert reg.withdraw(op_id)
    assert reg.flows.continuation_of(op_id) is None


# -- attach ------------------------------------------------------------------------------


def test_attach_to_an_already_finished_operation_resumes_at_once(reg: Registry) -> None:
    reg.reserve(_reservation("deferred:done"), T0)
    body = msgspec.msgpack.encode({"status": "completed", "n": 42})
    reg.settle("deferred:done", "completed", body, None, None, T0 + 1)
    _start(reg.flows, "run:late", T0 + 2)
    resumed = reg.attach(_continuation("deferred:done", "run:late"), T0 + 3)
    assert resumed == "run:late"
    flow = reg.flows.get("run:late")
    assert flow is not None and flow.state == "runnable"
    assert flow.step_index == RESUME_AT_STEP + 1
    assert flow.context[BINDING] == {"status": "completed", "n": 42}
    assert _continuation_row(reg, "deferred:done")[3] == T0 + 3
    # Attaching again (a second retry of the step) advances nothing a second time.
    assert reg.attach(_continuation("deferred:done", "run:late"), T0 + 4) is None
    assert reg.flows.get("run:late") == flow


def test_attach_to_a_failed_operation_fails_the_flow(reg: Registry) -> None:
    reg.reserve(_reservation("deferred:bad"), T0)
    reg.settle("deferred:bad", "failed", None, "action-failed", "exit 2", T0 + 1)
    _start(reg.flows, "run:bad", T0 + 2)
    assert reg.attach(_continuation("deferred:bad", "run:bad"), T0 + 3) == "run:bad"
    flow = reg.flows.get("run:bad")
    assert flow is not None and flow.state == "failed" and flow.last_code == "action-failed"


def test_attach_to_an_open_operation_parks_the_flow(reg: Registry) -> None:
    reg.reserve(_reservation("deferred:open"), T0)
    _start(reg.flows, "run:wait", T0 + 1)
    assert reg.attach(_continuation("deferred:open", "run:wait"), T0 + 2) is None
    flow = reg.flows.get("run:wait")
    assert flow is not None and flow.state == "suspended" and flow.operation_id == "deferred:open"
    assert reg.attach(_continuation("deferred:open", "run:wait"), T0 + 3) is None
    s = reg.settle("deferred:open", "completed", msgspec.msgpack.encode(1), None, None, T0 + 4)
    assert s.resumed_flow == "run:wait"
    flow = reg.flows.get("run:wait")
    assert flow is not None and flow.state == "runnable" and flow.context[BINDING] == 1


# -- the race: two processes, one resume ---------------------------------------------------

_COMPLETER = textwrap.dedent(
    """
    import json, random, sys, time
    from pathlib import Path
    import msgspec
    from sensorium.shared.deferred.policy import DeferredHostPolicy
    from sensorium.shared.deferred.registry import Registry

    db, name, base, ids_file = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    ids = json.loads(Path(ids_file).read_text())
    reg = Registry(Path(db), DeferredHostPolicy(1.0, 60.0, 900.0, 5, 0.2))
    print("ready", flush=True)
    sys.stdin.readline()
    won, lost = [], 0
    order = list(range(len(ids)))
    random.Random(name).shuffle(order)  # each its own order: they meet everywhere
    for k in order:
        # SQLite's busy handler favours whoever holds the lock; a pause between
        # operations lets the other completer in, so both win some races.
        time.sleep(0.001)
        for _ in range(2):  # each completer delivers its answer twice
            s = reg.settle(
                ids[k], "completed", msgspec.msgpack.encode({"by": name, "k": k}), None, None,
                base + k,
            )
            if s.changed:
                won.append([k, s.resumed_flow])
            else:
                lost += 1
    reg.close()
    print(json.dumps({"won": won, "lost": lost}), flush=True)
    """
)


def test_two_processes_racing_resume_each_flow_exactly_once(
    reg: Registry, db: Path, tmp_path: Path
) -> None:
    n = 200
    for i in range(n):  # FlowStore writes are their own transactions, outside batch()
        _start(reg.flows, f"run:{i:04d}")
    with reg.batch():
        pairs = [suspended(reg, i, started=True) for i in range(n)]
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps([op for op, _ in pairs]))
    bases = {"a": 10_000.0, "b": 20_000.0}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", _COMPLETER, str(db), name, str(base), str(ids_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, base in bases.items()
    }
    try:
        for proc in procs.values():
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs.values():  # both start together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports: dict[str, dict[str, Any]] = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            reports[name] = json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    winner: dict[int, str] = {}
    for name, report in reports.items():
        for k, resumed_flow in report["won"]:
            assert k not in winner, f"operation {k} was settled by both completers"
            winner[k] = name
            assert resumed_flow == pairs[k][1]
    # Exactly one of the four settles of each operation changed it.
    assert sorted(winner) == list(range(n)), f"{n - len(winner)} operations never settled"
    assert sum(r["lost"] for r in reports.values()) == 3 * n
    # Both completers really raced: each won some operations and lost others.
    wins = {name: len(r["won"]) for name, r in reports.items()}
    assert min(wins.values()) > 0, wins

    for k, (op_id, flow_id) in enumerate(pairs):
        name, at = winner[k], bases[winner[k]] + k
        op = reg.require(op_id)
        assert op.status == "completed" and op.updated_at == at
        assert msgspec.msgpack.decode(op.result or b"") == {"by": name, "k": k}
        flow = reg.flows.get(flow_id)
        assert flow is not None
        assert flow.state == "runnable"
        assert flow.step_index == RESUME_AT_STEP + 1
        # The winner's binding, the winner's time: the loser never touched the flow.
        assert flow.context == {
            "seed": flow_id,
            "earlier": [1, 2, 3],
            BINDING: {"by": name, "k": k},
        }
        assert flow.updated_at == at
        assert _continuation_row(reg, op_id)[3] == at


# -- FlowStore -------------------------------------------------------------------------


def test_flowstore_claim_advance_finish(reg: Registry) -> None:
    store = reg.flows
    _start(store, "run:1")
    flow = store.get("run:1")
    assert flow is not None and flow.state == "running" and flow.step_index == 0
    # A live runner's lease is respected; a lapsed one is taken over.
    assert store.claim("core:other", T0 + LEASE_S - 1, LEASE_S, 10) == []
    taken = store.claim("core:other", T0 + LEASE_S, LEASE_S, 10)
    assert [f.flow_id for f in taken] == ["run:1"]
    # Only the lease holder advances it.
    assert not store.advance("run:1", CORE, {"x": 1}, 1, T0 + LEASE_S + 1, LEASE_S)
    assert store.advance("run:1", "core:other", {"x": 1}, 1, T0 + LEASE_S + 1, LEASE_S)
    flow = store.get("run:1")
    assert flow is not None and flow.step_index == 1 and flow.context == {"x": 1}
    assert store.claim("core:third", T0 + LEASE_S + 2, LEASE_S, 10) == []
    assert store.finish("run:1", "completed", None, None, T0 + 70, {"x": 1, "y": 2})
    assert not store.finish("run:1", "failed", "late", "too late", T0 + 71)
    flow = store.get("run:1")
    assert flow is not None and flow.state == "completed" and flow.context == {"x": 1, "y": 2}
    assert flow.last_code is None
    assert store.claim("core:third", T0 + 1000, LEASE_S, 10) == []


def test_flowstore_claims_runnable_flows_up_to_the_limit(reg: Registry) -> None:
    ops = [suspended(reg, i) for i in range(5)]
    with reg.batch():
        for i, (op_id, _) in enumerate(ops):
            reg.settle(op_id, "completed", msgspec.msgpack.encode(i), None, None, T0 + 1 + i)
    first = reg.flows.claim("core:b", T0 + 10, LEASE_S, 3)
    assert [f.flow_id for f in first] == [flow for _, flow in ops[:3]]
    assert all(f.step_index == RESUME_AT_STEP + 1 for f in first)
    rest = reg.flows.claim("core:b", T0 + 10, LEASE_S, 3)
    assert [f.flow_id for f in rest] == [flow for _, flow in ops[3:]]
    assert reg.flows.claim("core:b", T0 + 10, LEASE_S, 3) == []
    running = reg.flows.get(ops[0][1])
    assert running is not None and running.state == "running"


def test_flowstore_recover_and_suspended_flows_are_not_claimed(reg: Registry) -> None:
    store = reg.flows
    _start(store, "run:dead")
    suspended(reg, 9)
    assert store.recover(CORE) == 0  # its own flows stay its own
    assert store.recover("core:new") == 1  # the dead core's running flow
    flow = store.get("run:dead")
    assert flow is not None and flow.state == "runnable"
    claimed = store.claim("core:new", T0 + 1, LEASE_S, 10)
    assert [f.flow_id for f in claimed] == ["run:dead"]
    assert store.finish("run:dead", "completed", None, None, T0 + 2)
    # A suspended flow waits for its operation, not for a runner.
    assert store.get("run:0009") is not None
    assert store.claim("core:new", T0 + 10_000, LEASE_S, 10) == []


def test_finish_fails_a_suspended_flow(reg: Registry) -> None:
    _op_id, flow_id = suspended(reg, 1)
    assert reg.flows.finish(flow_id, "failed", "connector-unavailable", "refused", T0 + 1)
    flow = reg.flows.get(flow_id)
    assert flow is not None and flow.state == "failed"


def test_collect_removes_old_finished_flows_and_their_continuations(reg: Registry) -> None:
    op_id, flow_id = suspended(reg, 1)
    reg.settle(op_id, "failed", None, "action-failed", None, T0 + 1)
    _start(reg.flows, "run:live", T0 + 1)
    retention = 86_400.0
    assert reg.collect(T0 + retention + 10, retention, 100) == 2  # the operation + its flow
    assert reg.flows.get(flow_id) is None
    assert reg.flows.continuation_of(op_id) is None  # ON DELETE CASCADE
    assert reg.flows.get("run:live") is not None
