"""A small flow runner: steps are directives, parameters are JSON-e, deferral suspends.

A flow runs step after step in core. A synchronous step's outcome is bound into
the context under its ``output_binding``. A step that defers persists an
``orbiplex-continuation.v1`` in the same registry transaction that reserves its
operation and suspends the flow; when the operation completes, the registry binds
the result and makes the flow runnable in the transaction that records the
completion, so it resumes exactly once, from the next step, in whichever core
process is running then.

``deferred_response_mode``: ``surface-to-caller`` (default) answers the caller with
the suspended flow and its operation's handle; ``reject-as-failure`` fails a step
that would defer with ``deferred-not-accepted`` before anything is dispatched.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog

from sensorium.core.deferral import handle
from sensorium.core.render import Renderer
from sensorium.shared.canonical import canonical_json
from sensorium.shared.clock import rfc3339
from sensorium.shared.deferred.continuations import Flow
from sensorium.shared.deferred.registry import Registry
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.wire.client_api import FlowRun
from sensorium.shared.wire.continuation import Caller, Continuation, ResumePoint
from sensorium.shared.wire.deferred import DIRECTIVE_KIND, DeferredOperation
from sensorium.shared.wire.directive import (
    Directive,
    Issuer,
    new_directive,
    parameters_problem,
)
from sensorium.shared.wire.flow import FlowDefinition, FlowStatus, FlowStep
from sensorium.shared.wire.outcome import Diagnostic, Outcome

log = structlog.get_logger("sensorium.core")
FLOW_MODULE_ID = "sensorium-core.flow-runner"
FLOW_ISSUER = Issuer(module_id=FLOW_MODULE_ID)
CLAIM_INTERVAL_S = 0.2
# Flows driven at once by the background runner (resumed or recovered ones).
MAX_DRIVEN = 32
# A flow's context (its inputs and every bound outcome) must fit a reply with room.
MAX_CONTEXT_BYTES = 1024 * 1024
# Refusals that pass: the step is tried again after the hinted delay, not failed.
PASSING = frozenset(
    {
        RuntimeErrorCode.OVERLOADED,
        RuntimeErrorCode.SHUTTING_DOWN,
        RuntimeErrorCode.CONNECTOR_UNAVAILABLE,
        RuntimeErrorCode.CATALOG_STALE,
    }
)

# (directive, continuation factory, the flow's caller key) -> outcome or handle; core's
# own invoke path.
Invoker = Callable[
    [Directive, Callable[[str], Continuation] | None, str | None],
    Awaitable[Outcome | DeferredOperation],
]
# (flow, its steps' action ids) -> how much of it the caller may see ("full" or
# "summary": without its context); raises ``grant-denied`` for nothing.
FlowAccess = Callable[[Flow, list[str]], str]
# action id -> whether it can only run deferred
AsyncOnly = Callable[[str], bool]
DefaultTimeout = Callable[[str], int]


def template_id(definition: FlowDefinition) -> str:
    body = canonical_json(msgspec.to_builtins(definition))
    return "template:sha256:" + hashlib.sha256(body).hexdigest()


class FlowRunner:
    def __init__(
        self,
        registry: Registry,
        invoke: Invoker,
        async_only: AsyncOnly,
        default_timeout_ms: DefaultTimeout,
        owner: str,
        lease_s: float,
        renderer: Renderer,
    ) -> None:
        self.registry = registry
        self.store = registry.flows
        self.invoke = invoke
        self.async_only = async_only
        self.default_timeout_ms = default_timeout_ms
        self.owner = owner
        self.lease_s = lease_s
        self._tasks: set[asyncio.Task[None]] = set()
        self.renderer = renderer

    def __repr__(self) -> str:
        return f"<FlowRunner {self.owner} driving={len(self._tasks)}>"

    async def start(self, req: FlowRun, caller_key: str | None = None) -> FlowStatus:
        definition = req.flow
        _check(definition)
        problem = parameters_problem(req.context)
        if problem is not None:
            raise CodedError(
                RuntimeErrorCode.FLOW_INVALID,
                problem.replace("parameters", "the flow's context", 1),
                path="$.context",
            )
        if len(msgspec.json.encode(req.context)) > MAX_CONTEXT_BYTES:
            raise CodedError(
                RuntimeErrorCode.FLOW_INVALID,
                f"the flow's context is over the {MAX_CONTEXT_BYTES} bytes a flow may carry",
                path="$.context",
            )
        flow_id = f"run:{new_id()}"
        await asyncio.to_thread(
            self.store.start,
            flow_id,
            template_id(definition),
            msgspec.json.encode(definition),
            dict(req.context),
            definition.deferred_response_mode,
            self.owner,
            time.time(),
            self.lease_s,
            caller_key,
        )
        log.info("flow.started", steps=len(definition.steps), **{"flow/id": flow_id})
        flow = await asyncio.to_thread(self.store.get, flow_id)
        assert flow is not None
        await self._drive(flow)
        return await self.status(flow_id)

    async def status(self, flow_id: str, access: FlowAccess | None = None) -> FlowStatus:
        flow = await asyncio.to_thread(self.store.get, flow_id)
        if flow is None:
            raise CodedError(
                RuntimeErrorCode.FLOW_UNKNOWN,
                f"no flow {flow_id[:140]!r} on this node (finished flows are kept for the "
                "deferred retention)",
                path="$.flow/id",
            )
        definition = msgspec.json.decode(flow.definition, type=FlowDefinition)
        seen = "full" if access is None else access(flow, [s.action_id for s in definition.steps])
        deferred = None
        if flow.state == "suspended" and flow.operation_id is not None:
            op = await asyncio.to_thread(self.registry.get, flow.operation_id)
            if op is not None and flow.deferred_response_mode == "surface-to-caller":
                deferred = handle(op)
        return FlowStatus(
            flow_id=flow.flow_id,
            template_id=flow.template_id,
            state=flow.state,  # type: ignore[arg-type]  # the table's CHECK keeps it valid
            step_index=flow.step_index,
            steps=len(definition.steps),
            # The context holds the steps' raw outcomes: only for its caller (and the
            # operator), never for another key (core/access.py).
            context=flow.context if seen == "full" and _fits(flow.context) else {},
            deferred=deferred,
            updated_at=rfc3339(flow.updated_at),
            diagnostics=(
                [Diagnostic(code=flow.last_code, message=flow.last_diagnostic or "")]
                if flow.last_code
                else []
            ),
        )

    async def serve(self, stop: asyncio.Event) -> None:
        """Drive flows a completion made runnable, and ones a dead core left behind."""
        recovered: int | None = None
        while not stop.is_set():
            room = MAX_DRIVEN - len(self._tasks)
            try:
                if recovered is None:
                    recovered = await asyncio.to_thread(self.store.recover, self.owner)
                    if recovered:
                        log.info("flow.recovered", flows=recovered)
                flows = (
                    await asyncio.to_thread(
                        self.store.claim, self.owner, time.time(), self.lease_s, min(room, 16)
                    )
                    if room > 0
                    else []
                )
            except CodedError as exc:
                # A full disk or read-only state: flows wait, the runner does not die.
                log.warning("flow.claim.failed", code=exc.code, error=exc.message)
                flows = []
            for flow in flows:
                task = asyncio.create_task(self._drive(flow))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), CLAIM_INTERVAL_S)
        for task in list(self._tasks):
            task.cancel()
        await self.renderer.close()

    async def _drive(self, flow: Flow) -> None:
        definition = msgspec.json.decode(flow.definition, type=FlowDefinition)
        context = dict(flow.context)
        if not _fits(context):  # a resumed step's outcome made it too big
            await self._finish(
                flow.flow_id,
                "failed",
                RuntimeErrorCode.FLOW_INVALID,
                f"the flow's context grew over the {MAX_CONTEXT_BYTES} bytes a flow may carry",
                None,
            )
            return
        with structlog.contextvars.bound_contextvars(**{"flow/id": flow.flow_id}):
            for index in range(flow.step_index, len(definition.steps)):
                step = definition.steps[index]
                try:
                    result = await self._step(flow, definition, index, step, context)
                except CodedError as exc:
                    if "operation/id" in exc.detail:
                        # In doubt: the step's operation is reserved and the flow parked
                        # on it; the poller settles it and the flow resumes or fails then.
                        log.warning("flow.step.in_doubt", step_id=step.step_id, code=exc.code)
                        return
                    if exc.code in PASSING:
                        log.info("flow.step.retry", step_id=step.step_id, code=exc.code)
                        at = time.time() + (exc.retry_after_ms or 1000) / 1000
                        await asyncio.to_thread(self.store.retry_later, flow.flow_id, at)
                        return
                    await self._finish(flow.flow_id, "failed", exc.code, exc.message, context)
                    return
                if isinstance(result, DeferredOperation):
                    log.info(
                        "flow.suspended",
                        step_id=step.step_id,
                        **{"operation/id": result.operation_id},
                    )
                    return
                context[step.output_binding] = msgspec.to_builtins(result)
                if not _fits(context):
                    await self._finish(
                        flow.flow_id,
                        "failed",
                        RuntimeErrorCode.FLOW_INVALID,
                        f"after step {step.step_id!r} the flow's context is over the "
                        f"{MAX_CONTEXT_BYTES} bytes a flow may carry",
                        {**context, step.output_binding: None},
                    )
                    return
                if result.status != "completed":
                    await self._finish(
                        flow.flow_id,
                        "failed",
                        RuntimeErrorCode.FLOW_STEP_FAILED,
                        f"step {step.step_id!r} ended {result.status}"
                        + (f" (exit {result.exit_code})" if result.exit_code is not None else ""),
                        context,
                    )
                    return
                await asyncio.to_thread(
                    self.store.advance,
                    flow.flow_id,
                    self.owner,
                    context,
                    index + 1,
                    time.time(),
                    self.lease_s,
                )
            await self._finish(flow.flow_id, "completed", None, None, context)

    async def _step(
        self,
        flow: Flow,
        definition: FlowDefinition,
        index: int,
        step: FlowStep,
        context: dict[str, Any],
    ) -> Outcome | DeferredOperation:
        parameters = await self._render(step, context)
        deferring = step.mode == "async" or self.async_only(step.action_id)
        if deferring and definition.deferred_response_mode == "reject-as-failure":
            raise CodedError(
                RuntimeErrorCode.DEFERRED_NOT_ACCEPTED,
                f"step {step.step_id!r} would defer ({step.action_id}) and this flow's "
                "deferred_response_mode is reject-as-failure; nothing was dispatched",
            )
        directive = new_directive(
            step.action_id,
            parameters,
            issuer=FLOW_ISSUER,
            mode="async" if deferring else "sync",
            timeout_ms=step.timeout_ms or self.default_timeout_ms(step.action_id),
            # A step re-run after a core crash finds its first attempt, not a second job.
            idempotency_key=f"flow:{flow.flow_id}:{index}",
            correlation_id=flow.flow_id,
        )

        def continuation(operation_id: str) -> Continuation:
            return Continuation(
                continuation_id=f"continuation:{new_id()}",
                workflow_run_id=flow.flow_id,
                step_id=step.step_id,
                deferred_operation_id=operation_id,
                resume_point=ResumePoint(
                    template_id=flow.template_id,
                    step_index=index,
                    step_id=step.step_id,
                    output_binding=step.output_binding,
                ),
                caller=Caller(module_id=FLOW_MODULE_ID),
                capability_id=DIRECTIVE_KIND,
                context=context,
                trace={"correlation/id": flow.flow_id},
                idempotency_key=directive.idempotency_key,
                deadline_at=directive.caller_deadline_at,
            )

        result = await self.invoke(directive, continuation if deferring else None, flow.caller_key)
        if isinstance(result, DeferredOperation):
            current = await asyncio.to_thread(self.store.get, flow.flow_id)
            if current is not None and current.state == "running":
                # A retried step found its first operation: park on it (or resume now).
                await asyncio.to_thread(
                    self.registry.attach, continuation(result.operation_id), time.time()
                )
        return result

    async def _render(self, step: FlowStep, context: dict[str, Any]) -> dict[str, Any]:
        rendered = await self.renderer.render(step.step_id, step.parameters, context)
        if not isinstance(rendered, dict):
            raise CodedError(
                RuntimeErrorCode.FLOW_INVALID,
                f"step {step.step_id!r}: its parameters template renders to "
                f"{type(rendered).__name__}, not an object",
            )
        return rendered

    async def _finish(
        self,
        flow_id: str,
        state: str,
        code: str | None,
        message: str | None,
        context: dict[str, Any] | None,
    ) -> None:
        await asyncio.to_thread(
            self.store.finish, flow_id, state, code, message, time.time(), context
        )
        log.info("flow.finished", state=state, code=code)


def _fits(context: dict[str, Any]) -> bool:
    return len(msgspec.json.encode(context)) <= MAX_CONTEXT_BYTES


def _check(definition: FlowDefinition) -> None:
    seen: set[str] = set()
    for i, step in enumerate(definition.steps):
        if step.step_id in seen:
            raise CodedError(
                RuntimeErrorCode.FLOW_INVALID,
                f"step_id {step.step_id!r} appears twice; each step needs its own",
                path=f"$.flow.steps[{i}].step_id",
            )
        seen.add(step.step_id)
