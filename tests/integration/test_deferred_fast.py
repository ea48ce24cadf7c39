"""The deferred fast path end to end: a job's end reaches core at once (the connector's
``ConnectorWatch``), a caller's ``wait`` is held by the node until then
(``sensorium.operation.wait``), and many statuses travel in one message
(``sensorium.operation.status-batch`` → ``ConnectorStatusBatch``).

The host here polls an operation no sooner than every 60 s, so an operation that
ends well within a wait's deadline can only have been settled by the completion path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from harness import Stack, deferrable_sleep, log_events, running_stack

from sensorium.client.aio import AsyncClient
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.client_api import OperationStatusBatch, OperationWait
from sensorium.shared.wire.deferred import (
    DeferredOperation,
    DeferredOperationStatus,
    OperationStatuses,
)

SLOW = {"preferred_retry_after_seconds": 60, "preferred_max_ttl_seconds": 600}
ACTIONS: list[dict[str, Any]] = [deferrable_sleep("test.defer.sleep", deferred_profile=SLOW)]
NODE = {"deferred": {"min_retry_s": 60, "max_retry_s": 120}}
UNKNOWN_OP = "deferred:sensorium.directive.invoke:01M8AAAAAAAAAAAAAAAAAAAAAA"


@pytest.fixture(scope="module")
def node() -> Iterator[Stack]:
    with running_stack(ACTIONS, node=NODE) as s:
        yield s


def _defer(node: Stack, seconds: float) -> DeferredOperation:
    with node.client() as c:
        op = c.invoke("test.defer.sleep", {"seconds": seconds}, mode="async")
    assert isinstance(op, DeferredOperation)
    return op


def _settled_by_completion(node: Stack, operation_id: str) -> bool:
    return any(
        e.get("by") == "completion" and e.get("operation/id") == operation_id
        for e in log_events(node.paths, "core", "operation.settled")
    )


def test_a_job_that_ends_is_settled_at_once_and_wakes_the_waiting_caller(node: Stack) -> None:
    op = _defer(node, 0.2)
    with node.client() as c:
        # Far sooner than the host's first poll (60 s): only the completion path ends it.
        final = c.wait(op, deadline=45, include_result=True)
        assert final.status == "completed"
        assert c.status(op).status == "completed"
    assert _settled_by_completion(node, op.operation_id)


def test_the_async_client_waits_the_same_way(node: Stack) -> None:
    op = _defer(node, 0.2)

    async def wait() -> DeferredOperationStatus:
        async with AsyncClient(state_dir=str(node.paths.root)) as c:
            return await c.wait(op, deadline=45)

    assert asyncio.run(wait()).status == "completed"
    assert _settled_by_completion(node, op.operation_id)


def test_a_held_read_answers_an_open_operation_when_its_wait_runs_out(node: Stack) -> None:
    op = _defer(node, 30)
    with SyncRpcClient(node.paths.ipc("core"), name="core") as rpc:
        got = rpc.call(
            OperationWait(request_id=new_id(), operation_id=op.operation_id, wait_ms=200),
            DeferredOperationStatus,
            30.0,
        )
    assert got.operation_id == op.operation_id and got.status in ("pending", "running")
    with node.client() as c:
        assert c.cancel(op).status == "cancelled"


def test_a_status_batch_answers_each_operation_on_its_own(node: Stack) -> None:
    done, running = _defer(node, 0.1), _defer(node, 30)
    with node.client() as c:
        assert c.wait(done, deadline=45).status == "completed"
    ids = [done.operation_id, UNKNOWN_OP, running.operation_id]
    with SyncRpcClient(node.paths.ipc("core"), name="core") as rpc:
        for refresh in (False, True):  # True: the open one is asked of the connector
            got = rpc.call(
                OperationStatusBatch(request_id=new_id(), operation_ids=ids, refresh=refresh),
                OperationStatuses,
                30.0,
            )
            assert [e.operation_id for e in got.entries] == ids
            first, unknown, last = got.entries
            assert first.status is not None and first.status.status == "completed"
            assert unknown.status is None and unknown.code == RuntimeErrorCode.OPERATION_UNKNOWN
            assert last.status is not None and last.status.status in ("pending", "running")
    with node.client() as c:
        assert c.cancel(running).status == "cancelled"
