"""Idempotency: a directive retried with the same ``idempotency/key`` gets the first
attempt's outcome, never a second spawn.

Three layers. Attempts still in flight here are joined in memory. Finished ones are
found in the audit store, durably, for ``limits.idempotency_window_s`` (24 h by
default). An attempt that was dispatched and never answered (core or connector died
mid-directive, or core stopped waiting) left its dispatch intent on disk: a retry
then *rejoins* — the connector hands over the attempt it still runs or has just
finished, and if it knows nothing of the key (it restarted too) the answer is
``outcome-in-doubt``, never a second spawn. A late reply that reaches the next core
is reconciled by the orphan desk into the outcome the retry then finds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from sensorium.core.audit import AuditStore
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.outcome import Outcome

log = structlog.get_logger("sensorium.core")
# Runs the directive; True asks the connector to rejoin an earlier attempt, never spawn.
Produce = Callable[[bool], Awaitable[Outcome]]


class Idempotency:
    def __init__(self, audit: AuditStore, window_s: float) -> None:
        self._audit = audit
        self._window_s = window_s
        self._inflight: dict[str, tuple[str, asyncio.Future[Outcome]]] = {}

    def __repr__(self) -> str:
        return f"<Idempotency inflight={len(self._inflight)} window_s={self._window_s}>"

    async def run(self, d: Directive, produce: Produce) -> Outcome:
        key = d.idempotency_key
        if key is None:
            return await produce(False)
        joined = self._inflight.get(key)
        if joined is not None:
            self._check_same_action(key, joined[0], d)
            log.info("directive.joined", key=key, **{"directive/id": d.directive_id})
            return await asyncio.shield(joined[1])
        # Claimed before the first await, so concurrent first attempts join this one.
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_observe)
        self._inflight[key] = (d.action_id, fut)
        try:
            outcome = await self._stored_or_new(key, d, produce)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        finally:
            del self._inflight[key]
        fut.set_result(outcome)
        return outcome

    async def _stored_or_new(self, key: str, d: Directive, produce: Produce) -> Outcome:
        since = time.time() - self._window_s
        stored = await asyncio.to_thread(self._audit.outcome_for_key, key, since)
        if stored is None:
            prior = await asyncio.to_thread(self._audit.prior_dispatch, key, since)
            if prior is None:
                return await produce(False)
            log.info(
                "directive.rejoining",
                key=key,
                first=prior.directive_id,
                settled=prior.settled or "never",
                **{"directive/id": d.directive_id},
            )
            return await produce(True)
        self._check_same_action(key, stored.action_id, d)
        log.info(
            "directive.deduplicated",
            key=key,
            receipt=f"outcome:{stored.outcome_id}",
            **{"directive/id": d.directive_id},
        )
        return stored

    @staticmethod
    def _check_same_action(key: str, first: str, d: Directive) -> None:
        if first != d.action_id:
            raise CodedError(
                RuntimeErrorCode.IDEMPOTENCY_CONFLICT,
                f"idempotency/key {key!r} was first used for {first}, not {d.action_id}; "
                "use a fresh key for a different directive",
                path="$.idempotency/key",
            )


def _observe(fut: asyncio.Future[Outcome]) -> None:
    # Nobody may be waiting on a failed first attempt; that is not an error to report.
    if not fut.cancelled():
        fut.exception()
