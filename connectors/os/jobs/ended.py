"""The jobs that ended lately, in the order they ended, for core's ``ConnectorWatch``.

Core holds one watch at a time: it names the ``seq`` of the last answer it had, and
the connector answers as soon as a job ends after it (or when the wait runs out).
Only operation ids are kept here, a bounded number: the answer reads each job's final
status from the store once. What falls out of memory (or ended under an earlier
instance) is not lost: the poller finds it at its next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

KEEP = 4096


class EndedFeed:
    def __init__(self, instance_id: str, keep: int = KEEP) -> None:
        self.instance_id = instance_id
        self.seq = 0
        self._ended: deque[tuple[int, str]] = deque(maxlen=keep)
        self._changed: asyncio.Event | None = None
        self.closed = False

    def __repr__(self) -> str:
        return f"<EndedFeed {self.instance_id} seq={self.seq}>"

    def add(self, operation_id: str) -> None:
        """A job ended (its end is on disk): wake the watch."""
        self.seq += 1
        self._ended.append((self.seq, operation_id))
        self._wake()

    def close(self) -> None:
        """The connector stops: a held watch is answered now, not at its timeout."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def after(
        self, seq: int, instance_id: str | None, wait_s: float
    ) -> tuple[int, list[str], bool]:
        """(the seq now, the ids that ended after ``seq``, whether that list is whole).
        A watch that names another instance (this one restarted) starts from 0."""
        if instance_id != self.instance_id or seq > self.seq:
            seq = 0
        if self.seq <= seq and not self.closed and wait_s > 0:
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait_s)
        ids = [op for s, op in self._ended if s > seq]
        whole = instance_id == self.instance_id and (
            not self._ended or self._ended[0][0] <= seq + 1
        )
        return self.seq, ids, whole
