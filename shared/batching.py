"""Draining a writer thread's queue into one batch (one transaction, one fsync)."""

from __future__ import annotations

import queue
from typing import TypeVar

T = TypeVar("T")


def take_batch(q: queue.SimpleQueue[T | None], first: T, most: int) -> tuple[list[T], bool]:
    """``first`` and whatever is queued behind it, at most ``most`` items; True when the
    stop sentinel (``None``) was met, so the writer ends after this batch."""
    batch = [first]
    while len(batch) < most:
        try:
            nxt = q.get_nowait()
        except queue.Empty:
            break
        if nxt is None:
            return batch, True
        batch.append(nxt)
    return batch, False
