"""The blocking client: ``Client``. Its asyncio twin is ``sensorium.client.aio.AsyncClient``.

Example (with ``sensorium up`` running on the default state directory)::

    from sensorium.client import Client

    with Client() as client:
        outcome = client.invoke("demo.fs.stat", {"path": "/etc/hostname"})
        print(outcome.status, outcome.result.pointers["bytes"])

        # Long work (an action whose catalog entry allows async): a handle at once,
        # the final status when the host has it.
        op = client.invoke(
            "demo.fs.find-large", {"path": "/usr", "min_mib": 10}, mode="async"
        )
        final = client.wait(op, deadline=120, include_result=True)
        print(final.status, final.result["exit_code"])

        # Surviving restarts: with an idempotency/key an invoke is sent again (up to 3
        # times) after Unavailable, Overloaded, ReplyTimeout or StorageUnavailable, and
        # core runs it at most once; an attempt whose outcome was lost raises InDoubt.
        outcome = client.invoke("demo.fs.stat", {"path": "/etc/hostname"}, retries=3)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, TypeVar, overload

import msgspec

from sensorium.client import reads
from sensorium.client.deferred import (
    ASYNC_ACK_TIMEOUT_S,
    FLOW_ENDED,
    Deadline,
    OperationRef,
    Retrier,
    StatusReads,
    flow_deadline,
    flow_definition,
    flow_reply_wait_s,
    flow_retry_hint,
    operation_deadline,
    operation_id_of,
    pause_s,
    read_timeout_s,
    retry_plan,
    seconds_until,
    timestamp,
)
from sensorium.client.endpoint import (
    CONTROL_TIMEOUT_S,
    MaxTimeouts,
    core_curve,
    core_endpoint,
    reply_wait_s,
)
from sensorium.client.endpoint import module_id as _module_id
from sensorium.client.errors import (
    ReplyTimeout,
    Retryable,
    SensoriumError,
    from_coded,
)
from sensorium.client.results import Answer, unwrap
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.curve import ClientKeys
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.audit import AuditPage, OutcomeRecord
from sensorium.shared.wire.client_api import (
    AuditGet,
    CatalogDescribe,
    CatalogView,
    FlowRun,
    FlowStatusRequest,
    HealthReply,
    Invoke,
    Ledger,
    LedgerQuery,
    OperationCancel,
    OperationListRequest,
    OperationStatusRequest,
    RecordingStatus,
    RecordStart,
    RecordStatusRequest,
    RecordStop,
)
from sensorium.shared.wire.declaration import SensitivityClass
from sensorium.shared.wire.deferred import DeferredOperation, DeferredOperationStatus, OperationList
from sensorium.shared.wire.directive import (
    DEFAULT_TIMEOUT_MS,
    Directive,
    Issuer,
    TimingMode,
    new_directive,
)
from sensorium.shared.wire.flow import FlowDefinition, FlowStatus
from sensorium.shared.wire.outcome import Outcome

T = TypeVar("T")


def make_directive(
    action_id: str,
    parameters: dict[str, Any] | None,
    *,
    issuer: Issuer,
    timeout_ms: int | None,
    idempotency_key: str | None,
    correlation_id: str | None,
    mode: TimingMode = "sync",
    deadline_at: str | datetime | None = None,
    consent: SensitivityClass | None = None,
) -> Directive:
    """A contract-valid ``sensorium-directive.v1``: issued now by ``issuer``, the caller's
    deadline at the top level, and nothing sent as ``null``."""
    return new_directive(
        action_id,
        parameters,
        issuer=issuer,
        timeout_ms=timeout_ms if timeout_ms is not None else DEFAULT_TIMEOUT_MS,
        mode=mode,
        deadline_at=timestamp(deadline_at),
        idempotency_key=idempotency_key,
        correlation_id=correlation_id,
        consent=consent,
    )


class Client:
    """A connection to sensorium-core. Not thread-safe: use one per thread.

    >>> client = Client(endpoint="ipc:///nonexistent/core.sock", connect_timeout_s=0.1)
    >>> try:
    ...     client.health()
    ... except Exception as exc:
    ...     print(type(exc).__name__, exc.code)
    Unavailable core-unavailable
    >>> client.close()
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        state_dir: str | None = None,
        connect_timeout_s: float = 2.0,
        curve: ClientKeys | None = None,
        module_id: str | None = None,
    ) -> None:
        self.endpoint = core_endpoint(endpoint, state_dir)
        # Who the directives say issued them (claimed: over ipc nothing proves it).
        self.issuer = Issuer(module_id=_module_id(module_id, curve.name if curve else None))
        # A tcp endpoint needs CURVE keys (ClientKeys.load(path)); ipc needs none.
        self._curve = core_curve(self.endpoint, state_dir, curve)
        self._connect_timeout_s = connect_timeout_s
        self._rpc = SyncRpcClient(
            self.endpoint, name="core", connect_timeout_s=connect_timeout_s, curve=self._curve
        )
        self._max_timeouts = MaxTimeouts()
        self._reads = StatusReads()

    def __repr__(self) -> str:
        return f"<Client {self._rpc!r}>"

    def _call(self, request: msgspec.Struct, result_type: type[T], timeout_s: float) -> T:
        try:
            return self._rpc.call(request, result_type, timeout_s)
        except CodedError as exc:
            raise from_coded(exc) from None

    def _reconnect(self) -> None:
        """Lazy Pirate: a socket whose request went unanswered is dropped, not reused;
        its late reply, should one come, dies with it."""
        self._rpc.close()
        self._rpc = SyncRpcClient(
            self.endpoint, name="core", connect_timeout_s=self._connect_timeout_s, curve=self._curve
        )

    @overload
    def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        mode: Literal["sync"] = "sync",
        timeout_ms: int | None = None,
        deadline_at: str | datetime | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        consent: SensitivityClass | None = None,
        reply_timeout_s: float | None = None,
        retries: int | None = None,
    ) -> Outcome: ...

    @overload
    def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        mode: Literal["async"],
        timeout_ms: int | None = None,
        deadline_at: str | datetime | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        consent: SensitivityClass | None = None,
        reply_timeout_s: float | None = None,
        retries: int | None = None,
    ) -> DeferredOperation: ...

    @overload
    def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        mode: TimingMode,
        timeout_ms: int | None = None,
        deadline_at: str | datetime | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        consent: SensitivityClass | None = None,
        reply_timeout_s: float | None = None,
        retries: int | None = None,
    ) -> Outcome | DeferredOperation: ...

    def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        mode: TimingMode = "sync",
        timeout_ms: int | None = None,
        deadline_at: str | datetime | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        consent: SensitivityClass | None = None,
        reply_timeout_s: float | None = None,
        retries: int | None = None,
    ) -> Outcome | DeferredOperation:
        """Run an action: ``mode="sync"`` returns its ``Outcome``; ``mode="async"``
        returns a ``DeferredOperation`` handle as soon as the connector has accepted the
        job (pass it to ``wait``, ``status`` or ``cancel``).

        A program that ran and failed is an ``Outcome`` with ``status`` ``failed`` or
        ``timed-out``; a directive core refused raises a ``Rejected`` subclass
        (``ExecutionModeUnsupported`` when the action's catalog entry does not allow
        the mode; ``ConsentRequired`` when the action is more sensitive than the node
        lets a caller trigger without consent: ``consent`` names the sensitivity class
        the caller explicitly consents to, sent as ``consent/sensitivity``).
        ``timeout_ms`` is the action's execution budget; ``deadline_at`` (RFC 3339 or
        an aware datetime) also bounds an operation's lifetime. Retrying
        an async invoke with the same ``idempotency_key`` returns the first handle.

        ``retries`` (Lazy Pirate): how many times the same directive is sent again after
        a ``Retryable`` error (``Unavailable``, ``Overloaded``, ``ReplyTimeout``,
        ``StorageUnavailable``). ``None``, the default, means 3 when an
        ``idempotency_key`` is given and 0 without one; retries without a key get a
        fresh ULID as key. Every attempt is a new request of the same directive (same
        ``directive/id``, same key), so core joins the attempt in flight, answers the
        recorded outcome or handle, or raises ``InDoubt`` (final, never retried) when an
        earlier attempt's outcome was lost: never a second spawn. Between attempts the
        client sleeps the error's ``retry_after_ms``, doubled for each retry already made
        (clamped to 0.05–2 s, with jitter); after a ``ReplyTimeout`` it drops its socket
        and connects afresh. No retry is sent
        past ``deadline_at``; each attempt waits at most ``reply_timeout_s`` (or the
        action's own budget plus the margin). The last ``Retryable`` error is raised when
        the retries are spent; its ``detail`` names ``attempts`` and ``idempotency/key``.
        """
        retries, key = retry_plan(retries, idempotency_key)
        if timeout_ms is None:
            self._max_timeout(action_id)  # learns the action's default too
        directive = make_directive(
            action_id,
            parameters,
            issuer=self.issuer,
            timeout_ms=timeout_ms
            if timeout_ms is not None
            else self._max_timeouts.default(action_id),
            idempotency_key=key,
            correlation_id=correlation_id,
            mode=mode,
            deadline_at=deadline_at,
            consent=consent,
        )
        retrier = Retrier(retries, key, directive.caller_deadline_at)
        while True:
            request = Invoke(request_id=new_id(), directive=directive)
            try:
                if mode == "async":
                    return unwrap(
                        self._call(request, Answer, reply_timeout_s or ASYNC_ACK_TIMEOUT_S)
                    )
                wait = reply_timeout_s or reply_wait_s(timeout_ms, self._max_timeout(action_id))
                return unwrap(self._call(request, Answer, wait))
            except Retryable as exc:
                pause = retrier.pause_s(exc)
                if pause is None:
                    raise
                if isinstance(exc, ReplyTimeout):
                    self._reconnect()
                time.sleep(pause)

    def _max_timeout(self, action_id: str) -> int | None:
        """The action's declared maximum, from the catalog (fetched now and then)."""
        if self._max_timeouts.stale(action_id):
            try:
                self._max_timeouts.update(self.describe())
            except SensoriumError:
                return None
        return self._max_timeouts.get(action_id)

    def _flow_max_timeouts(self, flow: FlowDefinition) -> dict[str, int | None]:
        """Each step's declared maximum, from one catalog fetch at most."""
        ids = {s.action_id for s in flow.steps}
        if any(self._max_timeouts.stale(a) for a in ids):
            with contextlib.suppress(SensoriumError):
                self._max_timeouts.update(self.describe())
        return {a: self._max_timeouts.get(a) for a in ids}

    # -- deferred operations ----------------------------------------------

    def status(
        self, op: OperationRef, *, refresh: bool = False, include_result: bool = False
    ) -> DeferredOperationStatus:
        """The operation's status as the host registry has it (cheap; the poller keeps it
        current). A final one carries ``result``: a summary with references (outcome/id,
        exit code, sizes), or with ``include_result=True`` the directive's raw outcome as
        a dict (argv, stdout, stderr), which only the key that created the operation and
        the operator may read (``GrantDenied`` otherwise).
        ``refresh=True`` asks the connector now instead (what ``sensorium ops poll``
        does); it does not record the answer. Unknown ids raise ``UnknownId``."""
        request = OperationStatusRequest(
            request_id=new_id(),
            operation_id=operation_id_of(op),
            refresh=refresh,
            include_result=include_result,
        )
        return self._call(request, DeferredOperationStatus, CONTROL_TIMEOUT_S)

    def cancel(self, op: OperationRef) -> DeferredOperationStatus:
        """Cancel host-side now (the connector's job is told, now or by the poller later);
        a final operation is returned unchanged. Raises ``NotCancelable`` (the message
        says why) for work that declared itself non-cancelable."""
        request = OperationCancel(request_id=new_id(), operation_id=operation_id_of(op))
        return self._call(request, DeferredOperationStatus, CONTROL_TIMEOUT_S)

    def operations(self, limit: int = 100, open_only: bool = False) -> OperationList:
        """The newest operations first (``open_only``: pending and running ones)."""
        request = OperationListRequest(request_id=new_id(), limit=limit, open_only=open_only)
        return self._call(request, OperationList, CONTROL_TIMEOUT_S)

    def wait(
        self, op: OperationRef, deadline: Deadline, *, include_result: bool = False
    ) -> DeferredOperationStatus:
        """Read the status until it is final, and return it (``include_result``: with the
        raw outcome, as ``status`` says).

        ``deadline`` is seconds from now or an aware datetime. Each read is held by the
        node until the job ends (``sensorium.operation.wait``, at most 10 s a read); a
        node older than that is read at the pace of the host's retry hint (clamped to
        0.2–2 s). No read sleeps past the deadline; if it
        passes first, ``DeadlineExceeded`` carries the last status as ``last`` (the
        operation goes on). Unreachable core raises ``Unavailable`` at once.
        """
        operation_id = operation_id_of(op)
        end = time.monotonic() + seconds_until(deadline)
        last: DeferredOperationStatus | None = None
        while True:
            request, reply_s = self._reads.request(
                operation_id, include_result, end - time.monotonic()
            )
            sent = time.monotonic()
            try:
                last = self._call(request, DeferredOperationStatus, reply_s)
            except ReplyTimeout:
                if time.monotonic() >= end:
                    raise operation_deadline(operation_id, last) from None
                raise
            except SensoriumError as exc:
                if self._reads.refused(exc):
                    continue
                raise
            if last.terminal:
                return last
            left = end - time.monotonic()
            if left <= 0:
                raise operation_deadline(operation_id, last)
            time.sleep(self._reads.pause(last, time.monotonic() - sent, left))

    # -- flows ------------------------------------------------------------

    def run_flow(
        self,
        definition: FlowDefinition | Mapping[str, Any],
        context: dict[str, Any] | None = None,
        *,
        correlation_id: str | None = None,
        reply_timeout_s: float | None = None,
    ) -> FlowStatus:
        """Start a flow (a ``FlowDefinition`` or its ``sensorium-flow.v1`` dict). Core runs
        its steps until the first that defers, then answers: ``completed``, ``failed``,
        or ``suspended`` with ``deferred`` naming the operation it waits on. The flow
        resumes by itself when that operation completes; ``wait_flow`` follows it.

        >>> with Client(endpoint="ipc:///nonexistent/core.sock") as client:
        ...     try:
        ...         client.run_flow({"steps": []})
        ...     except FlowInvalid as exc:
        ...         print(exc.code, exc.path)
        flow-invalid $.flow.steps
        """
        flow = flow_definition(definition)
        if reply_timeout_s is None:
            reply_timeout_s = flow_reply_wait_s(flow, self._flow_max_timeouts(flow))
        request = FlowRun(
            request_id=new_id(),
            flow=flow,
            context=dict(context or {}),
            correlation_id=correlation_id,
        )
        return self._call(request, FlowStatus, reply_timeout_s)

    def flow_status(self, flow_id: str) -> FlowStatus:
        """Where a flow is; ``UnknownId`` for a flow this node does not have."""
        request = FlowStatusRequest(request_id=new_id(), flow_id=flow_id)
        return self._call(request, FlowStatus, CONTROL_TIMEOUT_S)

    def wait_flow(self, flow_id: str, deadline: Deadline) -> FlowStatus:
        """Read the flow's status until it is ``completed`` or ``failed`` (same pacing and
        deadline rules as ``wait``)."""
        end = time.monotonic() + seconds_until(deadline)
        last: FlowStatus | None = None
        while True:
            request = FlowStatusRequest(request_id=new_id(), flow_id=flow_id)
            try:
                last = self._call(request, FlowStatus, read_timeout_s(end - time.monotonic()))
            except ReplyTimeout:
                if time.monotonic() >= end:
                    raise flow_deadline(flow_id, last) from None
                raise
            if last.state in FLOW_ENDED:
                return last
            left = end - time.monotonic()
            if left <= 0:
                raise flow_deadline(flow_id, last)
            time.sleep(pause_s(flow_retry_hint(last), left))

    # -- node -------------------------------------------------------------

    def describe(self) -> CatalogView:
        """The resolved catalog: every action a caller may name, with its state."""
        return self._call(CatalogDescribe(request_id=new_id()), CatalogView, CONTROL_TIMEOUT_S)

    def ledger(self, action_id: str | None = None) -> Ledger:
        return self._call(
            LedgerQuery(request_id=new_id(), action_id=action_id), Ledger, CONTROL_TIMEOUT_S
        )

    def audit_get(self, ident: str) -> OutcomeRecord:
        """A directive's ``sensorium-directive-outcome.v1`` by ``outcome/id`` (an invoke's
        receipt) or ``directive/id``. Restricted: ``GrantDenied`` for a CURVE key the
        operator has not granted ``audit``; ``UnknownId`` when there is none."""
        return self._call(AuditGet(request_id=new_id(), id=ident), OutcomeRecord, CONTROL_TIMEOUT_S)

    def audit_query(
        self,
        *,
        action_id: str | None = None,
        status: str | None = None,
        issuer: str | None = None,
        since: str | None = None,
        until: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> AuditPage:
        """A page of outcome records, newest first; the node caps ``limit``
        (``limits.audit_page_max``). Pass ``next_cursor`` back as ``cursor``."""
        request = reads.audit_query(
            action_id=action_id,
            status=status,
            issuer=issuer,
            since=since,
            until=until,
            limit=limit,
            cursor=cursor,
        )
        return self._call(request, AuditPage, CONTROL_TIMEOUT_S)

    def health(self) -> HealthReply:
        """``sensorium.health`` (the same answer as the earlier name ``health``)."""
        return self._call(reads.health(), HealthReply, CONTROL_TIMEOUT_S)

    # -- the consumer read paths (proposal 045 §7) ------------------------------

    def directives(self) -> reads.DirectiveList:
        """``sensorium.directive.list``: the actions this client may invoke, with their
        parameter schemas (over tcp, those its key is granted)."""
        return self._call(reads.directive_list(), reads.DirectiveList, CONTROL_TIMEOUT_S)

    def observe_query(self, **filters: Any) -> reads.ObservationPage:
        """``sensorium.observe.query``: one bounded page of stored observations; the
        filters are those of ``sensorium.client.reads.observe_query``. Pass the page's
        ``next_cursor`` as ``cursor`` for the next one."""
        return self._call(reads.observe_query(**filters), reads.ObservationPage, CONTROL_TIMEOUT_S)

    def observation(self, observation_id: str) -> reads.Observation:
        """``sensorium.observation.get``; ``UnknownId`` when it is not (or no longer) kept."""
        return self._call(
            reads.observation_get(observation_id), reads.Observation, CONTROL_TIMEOUT_S
        )

    def topic_summary(self, **filters: Any) -> reads.TopicSummary:
        """``sensorium.topic.summary``: per local topic, how many live records and when."""
        return self._call(reads.topic_summary(**filters), reads.TopicSummary, CONTROL_TIMEOUT_S)

    # -- recording (for `sensorium replay`) -----------------------------------

    def record_start(
        self,
        name: str | None = None,
        *,
        max_requests: int | None = None,
        max_bytes: int | None = None,
        max_duration_s: float | None = None,
    ) -> RecordingStatus:
        """Have core record every client request, with its arrival time, into
        ``<state>/recordings/NAME.srec`` until :meth:`record_stop` or a bound.
        ``RecordingActive`` if one already runs; under CURVE it needs the ``*`` grant."""
        req = RecordStart(
            request_id=new_id(),
            name=name,
            max_requests=max_requests,
            max_bytes=max_bytes,
            max_duration_s=max_duration_s,
        )
        return self._call(req, RecordingStatus, CONTROL_TIMEOUT_S)

    def record_stop(self) -> RecordingStatus:
        """Stop the recording (flushed and fsync'd); its final status names the file."""
        return self._call(RecordStop(request_id=new_id()), RecordingStatus, CONTROL_TIMEOUT_S)

    def record_status(self) -> RecordingStatus:
        """The running recording, else the last one since core started."""
        return self._call(
            RecordStatusRequest(request_id=new_id()), RecordingStatus, CONTROL_TIMEOUT_S
        )

    def close(self) -> None:
        self._rpc.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
