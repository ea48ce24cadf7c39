"""Group commit, on real SQLite files: the registry's committer thread, the connector's
batched job acceptances and the feed of ended jobs. Counts, never clocks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from sensorium.connectors.os.jobs.ended import EndedFeed
from sensorium.connectors.os.jobs.store import JobStore, NewJob, QueueFull
from sensorium.connectors.os.jobs.submissions import Submissions
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.registry import Registry, Reservation
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError

T0 = 1_700_000_000.0
POLICY = DeferredHostPolicy(
    min_retry_s=2.0, max_retry_s=60.0, max_ttl_s=900.0, max_attempts=5, jitter=0.2
)


def reservation(i: int | str) -> Reservation:
    return Reservation(
        operation_id=f"deferred:sensorium.directive.invoke:{i}",
        operation_kind="sensorium.directive.invoke",
        owner_module_id="sensorium-os",
        capability_id="sensorium.directive.invoke",
        directive_id=f"directive-{i}",
        action_id="demo.slow.job",
        correlation_id=None,
        idempotency_key=None,
        deadline_at=None,
        preferred_ttl_s=None,
        preferred_retry_s=None,
        cancel_unavailable_reason=None,
        audit_outcome_ref=f"outcome:{i}",
        confirm_within_s=15.0,
    )


def new(op: str) -> NewJob:
    return NewJob(
        operation_id=op,
        action_id="test.sleep",
        directive_id=f"d-{op}",
        directive=msgspec.msgpack.encode({"op": op}),
        timeout_ms=3000,
        config_hash="h1",
        accepted_by="instance-a",
    )


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    r = Registry(tmp_path / "deferred-operations.sqlite", POLICY)
    yield r
    r.close()


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(tmp_path / "jobs.sqlite")
    yield s
    s.close()


def test_concurrent_reservations_share_commits_and_each_gets_its_own_answer(
    registry: Registry,
) -> None:
    # Hold the registry's lock so that every submission queues behind the first commit.
    gate = threading.Event()
    held = registry.group.submit(lambda: gate.wait(10))
    futures = [
        registry.group.submit(lambda i=i: registry.reserve(reservation(i), T0)) for i in range(40)
    ]
    gate.set()
    held.result(10)
    answers = [f.result(10) for f in futures]
    assert [op.operation_id for op, new in answers] == [
        reservation(i).operation_id for i in range(40)
    ]
    assert all(new for _op, new in answers)
    # 41 transitions, far fewer commits: the 40 queued behind the first share them.
    assert registry.group.commits < 41
    assert registry.counts().get("pending") == 40


def test_a_failing_transition_fails_alone(registry: Registry) -> None:
    def boom() -> None:
        registry.reserve(reservation("x"), T0)
        raise ValueError("this one only")

    gate = threading.Event()
    held = registry.group.submit(lambda: gate.wait(10))
    bad = registry.group.submit(boom)
    good = registry.group.submit(lambda: registry.reserve(reservation("y"), T0))
    gate.set()
    held.result(10)
    with pytest.raises(ValueError, match="this one only"):
        bad.result(10)
    assert good.result(10)[1] is True
    # The failed one's writes were undone with it (its savepoint), the other's kept.
    assert registry.get(reservation("x").operation_id) is None
    assert registry.get(reservation("y").operation_id) is not None


def test_grouped_awaits_the_commit(registry: Registry) -> None:
    async def reserve_all() -> list[bool]:
        got = await asyncio.gather(
            *(registry.grouped(registry.reserve, reservation(i), T0) for i in range(16))
        )
        return [new for _op, new in got]

    assert asyncio.run(reserve_all()) == [True] * 16
    assert registry.counts().get("pending") == 16


def test_awaited_futures_of_one_batch_each_get_their_own_answer(registry: Registry) -> None:
    """The event-loop path (one hand-off per batch): a failing transition fails alone,
    early answers come before the durable ones, a cancelled caller is skipped."""

    def boom() -> None:
        registry.reserve(reservation("bad"), T0)
        raise ValueError("this one only")

    async def main() -> None:
        gate = threading.Event()
        held = registry.group.submit(lambda: gate.wait(10))
        good = [
            registry.group.submit_async(lambda i=i: registry.reserve(reservation(i), T0))
            for i in range(8)
        ]
        bad = registry.group.submit_async(boom)
        early, durable = registry.group.submit_early_async(
            lambda: registry.reserve(reservation("early"), T0)
        )
        gone = registry.group.submit_async(lambda: registry.reserve(reservation("gone"), T0))
        gone.cancel()
        gate.set()
        await asyncio.wrap_future(held)
        assert [new for _op, new in await asyncio.gather(*good)] == [True] * 8
        with pytest.raises(ValueError, match="this one only"):
            await bad
        first = await early
        assert (await durable) == first
        assert gone.cancelled()

    asyncio.run(main())
    assert registry.get(reservation("bad").operation_id) is None
    assert registry.get(reservation("early").operation_id) is not None
    # A cancelled caller's transition still ran and committed (it was queued already).
    assert registry.counts().get("pending") == 10


def test_a_batch_that_cannot_commit_fails_every_awaited_future(registry: Registry) -> None:
    def full_disk() -> None:
        raise CodedError(RuntimeErrorCode.STORAGE_UNAVAILABLE, "no space left")

    async def main() -> None:
        gate = threading.Event()
        held = registry.group.submit(lambda: gate.wait(10))
        before = registry.group.submit_async(lambda: registry.reserve(reservation("a"), T0))
        early, durable = registry.group.submit_early_async(full_disk)
        gate.set()
        await asyncio.wrap_future(held)
        for fut in (before, early, durable):
            with pytest.raises(CodedError) as info:
                await fut
            assert info.value.code == RuntimeErrorCode.STORAGE_UNAVAILABLE

    asyncio.run(main())
    # The batch was rolled back whole: the transition before the failure too.
    assert registry.get(reservation("a").operation_id) is None


def test_submit_many_answers_each_in_one_transaction(jobs: JobStore) -> None:
    got, claimed = jobs.submit_many([new("a"), new("b"), new("a"), new("c")], T0, max_pending=2)
    assert claimed == []
    first, second, again, full = got
    assert not isinstance(first, QueueFull) and first[1] is True
    assert not isinstance(second, QueueFull) and second[1] is True
    # The same operation twice in one batch is one job, the second told so.
    assert not isinstance(again, QueueFull) and again == (first[0], False)
    assert isinstance(full, QueueFull) and full.pending == 2
    assert jobs.get("c") is None and jobs.count("pending") == 2


def test_a_batch_also_claims_what_free_slots_can_run(jobs: JobStore) -> None:
    jobs.submit(new("older"), T0, max_pending=10)
    got, claimed = jobs.submit_many([new("x"), new("y")], T0 + 1, 10, claim=("instance-a", 2))
    assert all(not isinstance(g, QueueFull) and g[1] for g in got)
    # The oldest pending first, marked running for the instance in the same commit.
    assert [j.operation_id for j in claimed] == ["older", "x"]
    assert all(j.status == "running" and j.instance_id == "instance-a" for j in claimed)
    y = jobs.get("y")
    assert y is not None and y.status == "pending"


def test_acceptances_of_one_loop_turn_share_one_batch(jobs: JobStore) -> None:
    async def accept() -> tuple[int, int]:
        subs = Submissions(jobs, max_pending=100)
        got = await asyncio.gather(*(subs.submit(new(f"op-{i}")) for i in range(12)))
        created = sum(1 for g in got if not isinstance(g, QueueFull) and g[1])
        return created, subs.batches

    created, batches = asyncio.run(accept())
    assert created == 12 and batches == 1


def test_the_ended_feed_answers_what_ended_after_a_seq() -> None:
    async def run() -> None:
        feed = EndedFeed("i1", keep=3)
        # Nothing ended and no wait: an empty, whole answer.
        assert await feed.after(0, "i1", 0) == (0, [], True)
        waiter = asyncio.ensure_future(feed.after(0, "i1", 30))
        await asyncio.sleep(0)
        feed.add("op-1")
        assert await waiter == (1, ["op-1"], True)
        for op in ("op-2", "op-3", "op-4"):
            feed.add(op)
        assert await feed.after(2, "i1", 0) == (4, ["op-3", "op-4"], True)
        # op-1 fell out of memory: the answer says it is not whole.
        assert await feed.after(0, "i1", 0) == (4, ["op-2", "op-3", "op-4"], False)
        # A watch from before a restart (another instance) starts over, not whole.
        assert await feed.after(4, "i0", 0) == (4, ["op-2", "op-3", "op-4"], False)
        held = asyncio.ensure_future(feed.after(4, "i1", 30))
        await asyncio.sleep(0)
        feed.close()  # the connector stops: a held watch is answered now
        assert await held == (4, [], True)

    asyncio.run(run())
