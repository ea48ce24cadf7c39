"""Group commit for the registry: transitions handed in by many callers at once run in
one transaction (``RegistryBase.batch``: each in its own savepoint, so one that fails
undoes only itself), and one fsync at ``synchronous=FULL`` covers them all.

One thread commits; a caller waits for the commit that holds its transition, so
nothing is answered before it is on disk. A burst of 16 admissions is then a couple of
commits instead of 16.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from sensorium.shared.batching import take_batch
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError

MAX_BATCH = 256


class _Awaited(NamedTuple):
    """A future of an event loop: settled from that loop's thread, in one hand-off per
    batch for all of a batch's futures of that loop (a hand-off each, through the
    loop's self-pipe, cost more than the transition itself)."""

    loop: asyncio.AbstractEventLoop
    fut: asyncio.Future[Any]


_Sink = Future[Any] | _Awaited
# The transition, its future (resolved once committed) and, if asked for, a future
# resolved as soon as it ran inside the transaction (its answer before the fsync).
_Item = tuple[Callable[[], Any], _Sink, "_Sink | None"]


class GroupCommit:
    def __init__(
        self,
        batch: Callable[[], AbstractContextManager[None]],
        each: Callable[[], AbstractContextManager[Any]],
        name: str,
    ) -> None:
        self._batch = batch
        self._each = each
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self.commits = 0

    def __repr__(self) -> str:
        return f"<GroupCommit {self._name} commits={self.commits}>"

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        """``fn()`` in the next commit; its future resolves once that commit is done."""
        return self._submit(fn, None)

    def submit_early(self, fn: Callable[[], Any]) -> tuple[Future[Any], Future[Any]]:
        """``submit``, plus a future of ``fn()``'s answer as soon as it ran, before the
        commit: a caller can prepare what depends on it while the fsync runs (and must
        still wait for the second future before anyone is told)."""
        early: Future[Any] = Future()
        return early, self._submit(fn, early)

    def submit_async(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """``submit`` for a caller on an event loop: a future of that loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._put((fn, _Awaited(loop, fut), None))
        return fut

    def submit_early_async(
        self, fn: Callable[[], Any]
    ) -> tuple[asyncio.Future[Any], asyncio.Future[Any]]:
        """``submit_early`` for a caller on an event loop."""
        loop = asyncio.get_running_loop()
        early: asyncio.Future[Any] = loop.create_future()
        fut: asyncio.Future[Any] = loop.create_future()
        self._put((fn, _Awaited(loop, fut), _Awaited(loop, early)))
        return early, fut

    def _submit(self, fn: Callable[[], Any], early: Future[Any] | None) -> Future[Any]:
        fut: Future[Any] = Future()
        self._put((fn, fut, early))
        return fut

    def _put(self, item: _Item) -> None:
        self._queue.put(item)
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"group-commit-{self._name}", daemon=True
                    )
                    self._thread.start()

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, stop = take_batch(self._queue, item, MAX_BATCH)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[_Item]) -> None:
        answers: list[tuple[bool, Any]] = []
        try:
            with self._batch():
                for fn, _fut, _early in batch:
                    try:
                        with self._each():  # a savepoint: a failure undoes only itself
                            answers.append((True, fn()))
                    except CodedError as exc:
                        if exc.code == RuntimeErrorCode.STORAGE_UNAVAILABLE:
                            raise  # the commit cannot succeed: the whole batch fails
                        answers.append((False, exc))
                    except Exception as exc:  # this transition's own failure
                        answers.append((False, exc))
                # The early answers, before the commit's fsync.
                _settle(
                    [
                        (early, ok, value)
                        for (_fn, _fut, early), (ok, value) in zip(batch, answers, strict=True)
                        if early is not None
                    ]
                )
        except BaseException as exc:
            failed: list[tuple[_Sink, bool, Any]] = []
            for _fn, fut, early in batch:
                failed += [(f, False, exc) for f in (fut, early) if f is not None]
            _settle(failed)  # a sink already settled (an early answer) stays as it was
            if not isinstance(exc, Exception):
                raise
            return
        self.commits += 1
        _settle(
            [
                (fut, ok, value)
                for (_fn, fut, _early), (ok, value) in zip(batch, answers, strict=True)
            ]
        )


def _settle(results: list[tuple[_Sink, bool, Any]]) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for sink, ok, value in results:
        if isinstance(sink, _Awaited):
            by_loop.setdefault(sink.loop, []).append((sink.fut, ok, value))
        elif not sink.done():
            _resolve(sink, ok, value)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve_all, items)
        except RuntimeError:
            pass  # that loop is closed: nobody is waiting any more


def _resolve_all(items: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in items:
        if fut.done():
            continue  # cancelled, or settled already (an early answer, then a failed commit)
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _resolve(fut: Future[Any], ok: bool, value: Any) -> None:
    if not fut.set_running_or_notify_cancel():
        return  # cancelled: nobody waits
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
