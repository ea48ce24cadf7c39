"""Group commit of job acceptances: every async directive accepted in the same moment
is persisted by one transaction (one fsync at ``synchronous=FULL``) instead of one each.

The connector is one event loop and the store one connection used from it, so the
group forms on the loop: the first acceptance schedules a flush, and every request
the server has already read (its tasks run before the flush) joins the same batch.
While that commit holds the loop, the next requests queue on the socket; the loop
reads them all at once afterwards, and they form the next batch. Nothing is answered
before its batch is on disk. Jobs a free slot can run at once are marked ``running`` by
the same transaction (the scheduler starts them after it), so a job's start costs no
commit of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sensorium.connectors.os.jobs.store import Job, JobStore, NewJob, QueueFull

Submitted = tuple[Job, bool] | QueueFull


# Who claims the jobs a batch may start right away, and how many (None: none now).
Slots = Callable[[], tuple[str, int] | None]
Started = Callable[[list[Job]], None]


class Submissions:
    def __init__(
        self,
        store: JobStore,
        max_pending: int,
        slots: Slots = lambda: None,
        started: Started = lambda _jobs: None,
    ) -> None:
        self._store = store
        self._max_pending = max_pending
        self._slots = slots
        self._started = started
        self._waiting: list[tuple[NewJob, asyncio.Future[Submitted]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0

    def __repr__(self) -> str:
        return f"<Submissions waiting={len(self._waiting)} batches={self.batches}>"

    async def submit(self, new: NewJob) -> Submitted:
        """``JobStore.submit``'s answer for ``new`` (``QueueFull`` returned, not raised),
        once the batch it joined is committed; a storage failure is raised."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Submitted] = loop.create_future()
        self._waiting.append((new, fut))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush(), name="job-submissions")
        return await fut

    async def _flush(self) -> None:
        try:
            while self._waiting:
                await asyncio.sleep(0)  # requests already read reach submit() first
                batch, self._waiting = self._waiting, []
                try:
                    got, claimed = self._store.submit_many(
                        [new for new, _f in batch], time.time(), self._max_pending, self._slots()
                    )
                except Exception as exc:  # the whole transaction: every waiter hears it
                    for _new, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                self.batches += 1
                if claimed:  # marked running with the batch: they start now
                    self._started(claimed)
                for (_new, fut), answer in zip(batch, got, strict=True):
                    if not fut.done():
                        fut.set_result(answer)
        finally:
            self._flusher = None
