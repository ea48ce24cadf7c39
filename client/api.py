"""The blocking client: ``Client``. Its asyncio twin is ``sensorium.client.aio.AsyncClient``.

Example (with ``sensorium up`` running on the default state directory)::

    from sensorium.client import Client

    with Client() as client:
        outcome = client.invoke("demo.fs.stat", {"path": "/etc/hostname"})
        print(outcome.status, outcome.result.pointers["bytes"])
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from sensorium.client.endpoint import MaxTimeouts, core_endpoint, reply_wait_s
from sensorium.client.errors import SensoriumError, from_coded
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.client_api import (
    CatalogDescribe,
    CatalogView,
    Health,
    HealthReply,
    Invoke,
    Ledger,
    LedgerQuery,
    OperationListRequest,
)
from sensorium.shared.wire.deferred import OperationList
from sensorium.shared.wire.directive import Directive, Timing
from sensorium.shared.wire.outcome import Outcome

T = TypeVar("T")
CONTROL_TIMEOUT_S = 5.0


def make_directive(
    action_id: str,
    parameters: dict[str, Any] | None,
    *,
    timeout_ms: int | None,
    idempotency_key: str | None,
    correlation_id: str | None,
) -> Directive:
    return Directive(
        directive_id=new_id(),
        action_id=action_id,
        parameters=dict(parameters or {}),
        timing=Timing(mode="sync", timeout_ms=timeout_ms),
        idempotency_key=idempotency_key,
        correlation_id=correlation_id,
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
    ) -> None:
        self.endpoint = core_endpoint(endpoint, state_dir)
        self._rpc = SyncRpcClient(self.endpoint, name="core", connect_timeout_s=connect_timeout_s)
        self._max_timeouts = MaxTimeouts()

    def __repr__(self) -> str:
        return f"<Client {self._rpc!r}>"

    def _call(self, request: msgspec.Struct, result_type: type[T], timeout_s: float) -> T:
        try:
            return self._rpc.call(request, result_type, timeout_s)
        except CodedError as exc:
            raise from_coded(exc) from None

    def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        timeout_ms: int | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        reply_timeout_s: float | None = None,
    ) -> Outcome:
        """Run an action synchronously and return its outcome.

        A program that ran and failed is an ``Outcome`` with ``status`` ``failed`` or
        ``timed-out``; a directive core refused raises a ``Rejected`` subclass.
        """
        directive = make_directive(
            action_id,
            parameters,
            timeout_ms=timeout_ms,
            idempotency_key=idempotency_key,
            correlation_id=correlation_id,
        )
        wait = reply_timeout_s or reply_wait_s(timeout_ms, self._max_timeout(action_id))
        return self._call(Invoke(request_id=new_id(), directive=directive), Outcome, wait)

    def _max_timeout(self, action_id: str) -> int | None:
        """The action's declared maximum, from the catalog (fetched now and then)."""
        if self._max_timeouts.stale(action_id):
            try:
                self._max_timeouts.update(self.describe())
            except SensoriumError:
                return None
        return self._max_timeouts.get(action_id)

    def describe(self) -> CatalogView:
        """The resolved catalog: every action a caller may name, with its state."""
        return self._call(CatalogDescribe(request_id=new_id()), CatalogView, CONTROL_TIMEOUT_S)

    def ledger(self, action_id: str | None = None) -> Ledger:
        return self._call(
            LedgerQuery(request_id=new_id(), action_id=action_id), Ledger, CONTROL_TIMEOUT_S
        )

    def operations(self, limit: int = 100) -> OperationList:
        return self._call(
            OperationListRequest(request_id=new_id(), limit=limit), OperationList, CONTROL_TIMEOUT_S
        )

    def health(self) -> HealthReply:
        return self._call(Health(request_id=new_id()), HealthReply, CONTROL_TIMEOUT_S)

    def close(self) -> None:
        self._rpc.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
