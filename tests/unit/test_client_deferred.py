"""The client's deferred-operation and flow surface, without a node.

A scripted core — the real RPC server on a real ipc socket, answering from a
script — stands in where core's answers matter; the rest needs no peer at all
or a closed endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
import typing
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import msgspec
import pytest
import zmq.asyncio

from sensorium.client import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    FlowInvalid,
    NotCancelable,
    Unavailable,
    UnknownId,
    errors,
)
from sensorium.client import deferred as api
from sensorium.client.endpoint import CONTROL_TIMEOUT_S
from sensorium.shared.clock import rfc3339
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.wire.client_api import (
    ClientRequest,
    FlowRun,
    FlowStatusRequest,
    Invoke,
    OperationCancel,
    OperationStatusRequest,
)
from sensorium.shared.wire.deferred import DeferredOperation, DeferredOperationStatus
from sensorium.shared.wire.directive import Directive, TimingMode
from sensorium.shared.wire.flow import FlowDefinition, FlowStatus, FlowStep
from sensorium.shared.wire.outcome import Outcome

OP = "deferred:sensorium.directive.invoke:01TEST"
FLOW = {
    "steps": [
        {"step_id": "fetch", "action_id": "test.echo-args", "output_binding": "fetched"},
        {"step_id": "slow", "action_id": "test.sleep", "output_binding": "slept", "mode": "async"},
    ]
}


def _closed() -> str:
    return f"ipc://{tempfile.mkdtemp(prefix='cl-', dir='/tmp')}/core.sock"


def _handle(op_id: str = OP) -> DeferredOperation:
    now = time.time()
    return DeferredOperation(
        operation_id=op_id,
        retry_after_seconds=1,
        created_at=rfc3339(now),
        expires_at=rfc3339(now + 900),
        cancel_href=f"sensorium.operation.cancel?operation/id={op_id}",
    )


def _status(status: str, op_id: str = OP, result: Any = None) -> DeferredOperationStatus:
    return DeferredOperationStatus(
        operation_id=op_id,
        status=status,  # type: ignore[arg-type]
        updated_at=rfc3339(),
        retry_after_seconds=1 if status in ("pending", "running") else msgspec.UNSET,
        result=msgspec.UNSET if result is None else result,
    )


class ScriptedCore:
    """Answers from a script: ``finish_after`` reads of an operation or flow before it ends."""

    def __init__(self, finish_after: int = 1) -> None:
        self.finish_after = finish_after
        self.reads: list[str] = []
        self.directives: list[Directive] = []
        self.flows: list[FlowRun] = []

    async def status(self, req: OperationStatusRequest) -> DeferredOperationStatus:
        if req.operation_id.endswith("nope"):
            raise CodedError("operation-unknown", f"no deferred operation {req.operation_id!r}")
        self.reads.append(req.operation_id)
        done = len(self.reads) > self.finish_after
        return _status("completed" if done else "running", req.operation_id, {"status": "x"})

    async def cancel(self, req: OperationCancel) -> DeferredOperationStatus:
        raise CodedError("operation-not-cancelable", f"{req.operation_id}: it sends a letter")

    async def invoke(self, req: Invoke) -> Outcome | DeferredOperation:
        self.directives.append(req.directive)
        if req.directive.timing.mode == "async":
            return _handle()
        return Outcome(
            outcome_id="o",
            directive_id=req.directive.directive_id,
            action_id=req.directive.action_id,
            status="completed",
            started_at=rfc3339(),
            duration_ms=1.0,
            timeout_ms=1000,
        )

    async def run_flow(self, req: FlowRun) -> FlowStatus:
        self.flows.append(req)
        return self._flow("run:01F", "suspended")

    async def flow_status(self, req: FlowStatusRequest) -> FlowStatus:
        if req.flow_id.endswith("nope"):
            raise CodedError("flow-unknown", f"no flow {req.flow_id!r}")
        self.reads.append(req.flow_id)
        done = len([r for r in self.reads if r == req.flow_id]) > self.finish_after
        return self._flow(req.flow_id, "completed" if done else "suspended")

    def _flow(self, flow_id: str, state: str) -> FlowStatus:
        return FlowStatus(
            flow_id=flow_id,
            template_id="template:t",
            state=state,  # type: ignore[arg-type]
            step_index=1,
            steps=2,
            deferred=_handle() if state == "suspended" else None,
            updated_at=rfc3339(),
        )


@contextlib.asynccontextmanager
async def scripted(core: ScriptedCore) -> AsyncIterator[AsyncClient]:
    ctx = zmq.asyncio.Context()
    endpoint = _closed()
    server = RpcServer(
        ctx,
        endpoint,
        ClientRequest,
        {
            OperationStatusRequest: core.status,
            OperationCancel: core.cancel,
            Invoke: core.invoke,
            FlowRun: core.run_flow,
            FlowStatusRequest: core.flow_status,
        },
        name="scripted-core",
    )
    server.bind()
    task = asyncio.create_task(server.serve())
    client = AsyncClient(endpoint)
    try:
        await client.wait_connected()
        yield client
    finally:
        await client.close()
        task.cancel()
        server.close()
        ctx.term()


def _raised_soon(call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised, run in a thread; it must end well within a minute (each
    call here would take an hour if it kept waiting)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except Exception as exc:
            raised.append(exc)

    caller = threading.Thread(target=run, daemon=True)
    caller.start()
    caller.join(60)
    assert not caller.is_alive(), "it kept waiting"
    return raised[0] if raised else None


def test_waits_fail_at_once_when_core_is_not_there() -> None:
    # Each wait may last an hour: one that kept trying would still be running after
    # the generous bound below, one that fails at once is long done.
    endpoint = _closed()
    with Client(endpoint, connect_timeout_s=0.2) as client:
        for wait in (lambda: client.wait(OP, 3600), lambda: client.wait_flow("run:1", 3600)):
            err = _raised_soon(wait)
            assert isinstance(err, Unavailable) and err.code == "core-unavailable"

    async def main() -> None:
        client = AsyncClient(endpoint)
        try:
            with pytest.raises(Unavailable):
                await asyncio.wait_for(client.wait(_handle(), 3600), 60)
        finally:
            await client.close()

    asyncio.run(main())


def test_a_wait_paces_by_the_hint_and_takes_a_handle_a_status_or_an_id() -> None:
    async def main() -> None:
        core = ScriptedCore(finish_after=1)
        async with scripted(core) as client:
            t0 = time.monotonic()
            final, flow = await asyncio.gather(
                client.wait(_handle(), 10), client.wait_flow("run:01F", 10)
            )
            elapsed = time.monotonic() - t0
            assert final.status == "completed" and final.result == {"status": "x"}
            assert flow.state == "completed"
            # One read said running with a 1 s hint: the second came a second later.
            assert 0.9 <= elapsed < 3, elapsed
            assert (await client.status(_status("running"))).operation_id == OP
            assert (await client.status(OP)).operation_id == OP
            assert set(core.reads) == {OP, "run:01F"}

    asyncio.run(main())


def test_a_deadline_that_passes_first_carries_the_last_status() -> None:
    async def main() -> None:
        async with scripted(ScriptedCore(finish_after=10**6)) as client:
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceeded) as err:
                await client.wait(OP, 0.4)
            assert 0.35 <= time.monotonic() - t0 < 1.5  # never slept past the deadline
            assert err.value.code == "deadline-exceeded"
            assert isinstance(err.value.last, DeferredOperationStatus)
            assert err.value.last.status == "running" and OP in err.value.message

            deadline = datetime.now(UTC) + timedelta(seconds=0.3)
            with pytest.raises(DeadlineExceeded) as flow_err:
                await client.wait_flow("run:01F", deadline)
            assert isinstance(flow_err.value.last, FlowStatus)
            assert flow_err.value.last.state == "suspended"

            with pytest.raises(ValueError, match="aware"):
                await client.wait(OP, datetime.now())

    asyncio.run(main())


def test_core_refusals_arrive_as_their_classes() -> None:
    async def main() -> None:
        async with scripted(ScriptedCore()) as client:
            with pytest.raises(UnknownId):
                await client.status("deferred:nope")
            with pytest.raises(UnknownId) as err:
                await client.flow_status("run:nope")
            assert err.value.code == "flow-unknown"
            with pytest.raises(NotCancelable, match="sends a letter"):
                await client.cancel(_handle())

    asyncio.run(main())
    codes = {
        "operation-unknown": errors.UnknownId,
        "flow-unknown": errors.UnknownId,
        "operation-not-cancelable": errors.NotCancelable,
        "deferred-not-accepted": errors.ExecutionModeUnsupported,
        "execution-mode-unsupported": errors.ExecutionModeUnsupported,
        "flow-invalid": errors.FlowInvalid,
        "flow-step-failed": errors.FlowFailed,
        "deadline-exceeded": errors.DeadlineExceeded,
    }
    for code, cls in codes.items():
        assert type(errors.from_coded(CodedError(code, "m"))) is cls
    assert errors.from_coded(CodedError("deadline-exceeded", "m")).last is None  # type: ignore[attr-defined]


def test_invoke_mode_picks_the_reply_type() -> None:
    for cls in (Client, AsyncClient):
        sync, deferred, either = (
            typing.get_type_hints(f) for f in typing.get_overloads(cls.invoke)
        )
        assert sync["mode"] == Literal["sync"] and sync["return"] is Outcome
        assert deferred["mode"] == Literal["async"] and deferred["return"] is DeferredOperation
        assert either["mode"] == TimingMode and either["return"] == Outcome | DeferredOperation

    async def main() -> None:
        core = ScriptedCore()
        async with scripted(core) as client:
            deadline = datetime.now(UTC) + timedelta(minutes=5)
            op = await client.invoke(
                "test.sleep", {"seconds": 1}, mode="async", deadline_at=deadline
            )
            assert isinstance(op, DeferredOperation) and op.operation_id == OP
            outcome = await client.invoke("test.sleep", {"seconds": 1})
            assert isinstance(outcome, Outcome)
            sent = core.directives[0]
            # The caller's deadline at the top level (the contract's place for it).
            assert sent.timing.mode == "async" and sent.deadline_at == rfc3339(deadline.timestamp())
            assert sent.timing.deadline_at is None and sent.timing.timeout_ms >= 1
            assert sent.issuer.module_id == client.issuer.module_id and sent.directive_issued_at
            assert core.directives[1].timing.mode == "sync"
            with pytest.raises(ValueError, match="aware"):
                await client.invoke("test.sleep", mode="async", deadline_at=datetime.now())

    asyncio.run(main())


def test_a_flow_dict_is_checked_before_it_is_sent() -> None:
    assert api.flow_definition(FLOW) == FlowDefinition(
        steps=[
            FlowStep(step_id="fetch", action_id="test.echo-args", output_binding="fetched"),
            FlowStep(step_id="slow", action_id="test.sleep", output_binding="slept", mode="async"),
        ]
    )
    bad: list[tuple[Any, str]] = [
        ({"steps": []}, "$.flow.steps"),
        ({"steps": [{"step_id": "a", "action_id": "x"}]}, "$.flow.steps[0]"),
        (
            {"steps": [{"step_id": "1a", "action_id": "x", "output_binding": "o"}]},
            "$.flow.steps[0].step_id",
        ),
        ({**FLOW, "retries": 3}, "$.flow"),
        ({**FLOW, "deferred_response_mode": "ignore"}, "$.flow.deferred_response_mode"),
        (["not", "an", "object"], "$.flow"),
    ]
    for document, path in bad:
        with pytest.raises(FlowInvalid) as err:
            api.flow_definition(document)
        assert err.value.code == "flow-invalid" and err.value.path == path, (document, err.value)
    # Refused before any request: a closed endpoint is never even tried (a try would
    # wait out the hour-long connect timeout).
    with Client(_closed(), connect_timeout_s=3600) as client:
        assert isinstance(_raised_soon(lambda: client.run_flow({"steps": []})), FlowInvalid)

    async def main() -> None:
        core = ScriptedCore()
        async with scripted(core) as client:
            status = await client.run_flow(FLOW, {"k": 1}, correlation_id="c-1", reply_timeout_s=5)
            assert status.state == "suspended" and status.deferred is not None
            assert core.flows[0].flow == api.flow_definition(FLOW)
            assert core.flows[0].context == {"k": 1} and core.flows[0].correlation_id == "c-1"

    asyncio.run(main())


def test_pacing_and_deadlines_are_clamped() -> None:
    assert api.pause_s(None, 10) == 1.0
    assert api.pause_s(30, 10) == api.MAX_PAUSE_S
    assert api.pause_s(1, 0.05) == 0.05  # never past the deadline
    assert api.read_timeout_s(0.0) == api.MIN_PAUSE_S
    assert api.read_timeout_s(100) == CONTROL_TIMEOUT_S
    assert api.seconds_until(-5) == 0.0
    assert 9 < api.seconds_until(datetime.now(UTC) + timedelta(seconds=10)) <= 10
    with pytest.raises(TypeError):
        api.seconds_until("10")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        api.operation_id_of("")
    assert api.operation_id_of(_handle()) == api.operation_id_of(_status("failed")) == OP
    assert msgspec.json.decode(msgspec.json.encode(_handle()), type=DeferredOperation).cancelable
