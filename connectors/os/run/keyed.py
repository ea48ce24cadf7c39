"""Attempts under an ``idempotency/key``, as the connector sees them.

Core owns deduplication durably; this is the connector's half of "never two spawns
for one key". When core dies mid-directive and a retry arrives through its next
incarnation, the attempt may still be running here (the retry joins it) or may have
finished moments ago (the retry gets its outcome). Memory only, bounded in count and
age: it needs to cover a core restart, not a day.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.outcome import Outcome

MAX_REMEMBERED = 4096
REMEMBER_S = 3600.0


class KeyedAttempts:
    def __init__(
        self, max_remembered: int = MAX_REMEMBERED, remember_s: float = REMEMBER_S
    ) -> None:
        self._running: dict[str, tuple[str, asyncio.Future[Outcome]]] = {}
        self._finished: OrderedDict[str, tuple[float, str, Outcome]] = OrderedDict()
        self._max = max_remembered
        self._remember_s = remember_s

    def __repr__(self) -> str:
        return f"<KeyedAttempts running={len(self._running)} finished={len(self._finished)}>"

    async def run(
        self, d: Directive, rejoin: bool, spawn: Callable[[], Awaitable[Outcome]]
    ) -> Outcome:
        key = d.idempotency_key
        if key is None:
            return await spawn()
        self._expire(time.monotonic())
        running = self._running.get(key)
        if running is not None:
            _check(key, running[0], d)
            return await asyncio.shield(running[1])
        finished = self._finished.get(key)
        if finished is not None:
            _check(key, finished[1], d)
            return finished[2]
        if rejoin:
            raise CodedError(
                RuntimeErrorCode.OUTCOME_IN_DOUBT,
                f"an earlier attempt under idempotency/key {key!r} was dispatched and its "
                "outcome was lost (a process restarted mid-directive); it is not run again "
                "under this key. Check its effect, then use a fresh key to run it again",
                path="$.directive.idempotency/key",
            )
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_observe)
        self._running[key] = (d.action_id, fut)
        try:
            outcome = await spawn()
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
            raise
        finally:
            del self._running[key]
        fut.set_result(outcome)
        self._finished[key] = (time.monotonic(), d.action_id, outcome)
        while len(self._finished) > self._max:
            self._finished.popitem(last=False)
        return outcome

    def _expire(self, now: float) -> None:
        while self._finished:
            at = next(iter(self._finished.values()))[0]
            if now - at < self._remember_s:
                return
            self._finished.popitem(last=False)


def _check(key: str, first: str, d: Directive) -> None:
    if first != d.action_id:
        raise CodedError(
            RuntimeErrorCode.IDEMPOTENCY_CONFLICT,
            f"idempotency/key {key!r} was first used for {first}, not {d.action_id}",
            path="$.directive.idempotency/key",
        )


def _observe(fut: asyncio.Future[Outcome]) -> None:
    if not fut.cancelled():
        fut.exception()
