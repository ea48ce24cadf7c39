"""Group commit for the registry: transitions handed in by many callers at once run in
one transaction (``RegistryBase.batch``: each in its own savepoint, so one that fails
undoes only itself), and one fsync at ``synchronous=FULL`` covers them all.

One thread commits; a caller waits for the commit that holds its transition, so
nothing is answered before it is on disk. A burst of 16 admissions is then a couple of
commits instead of 16.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

from sensorium.shared.batching import take_batch
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError

MAX_BATCH = 256
# The transition, its future (resolved once committed) and, if asked for, a future
# resolved as soon as it ran inside the transaction (its answer before the fsync).
_Item = tuple[Callable[[], Any], "Future[Any]", "Future[Any] | None"]


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

    def _submit(self, fn: Callable[[], Any], early: Future[Any] | None) -> Future[Any]:
        fut: Future[Any] = Future()
        self._queue.put((fn, fut, early))
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"group-commit-{self._name}", daemon=True
                    )
                    self._thread.start()
        return fut

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
                for fn, _fut, early in batch:
                    try:
                        with self._each():  # a savepoint: a failure undoes only itself
                            answers.append((True, fn()))
                    except CodedError as exc:
                        if exc.code == RuntimeErrorCode.STORAGE_UNAVAILABLE:
                            raise  # the commit cannot succeed: the whole batch fails
                        answers.append((False, exc))
                    except Exception as exc:  # this transition's own failure
                        answers.append((False, exc))
                    if early is not None:
                        _resolve(early, *answers[-1])
        except BaseException as exc:
            for _fn, fut, early in batch:
                for f in (fut, early):
                    if f is not None and not f.done() and f.set_running_or_notify_cancel():
                        f.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        self.commits += 1
        for (_fn, fut, _early), (ok, value) in zip(batch, answers, strict=True):
            _resolve(fut, ok, value)


def _resolve(fut: Future[Any], ok: bool, value: Any) -> None:
    if not fut.set_running_or_notify_cancel():
        return  # cancelled: nobody waits
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
