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

A key is bound to its caller, action and parameters (``core/keyspace.py``): a reuse
that does not match is ``idempotency-conflict``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from sensorium.core.audit import AuditStore, PriorDispatch
from sensorium.core.keyspace import check_binding, params_digest
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.outcome import Outcome

log = structlog.get_logger("sensorium.core")
# Runs the directive; an earlier attempt's dispatch asks the connector to rejoin that
# attempt, never spawn (``None``: no earlier attempt, a fresh one).
Produce = Callable[[PriorDispatch | None], Awaitable[Outcome]]


class Idempotency:
    def __init__(self, audit: AuditStore, window_s: float) -> None:
        self._audit = audit
        self._window_s = window_s
        # key -> (action, parameters digest, the first attempt's outcome)
        self._inflight: dict[str, tuple[str, str, asyncio.Future[Outcome]]] = {}

    def __repr__(self) -> str:
        return f"<Idempotency inflight={len(self._inflight)} window_s={self._window_s}>"

    async def run(self, d: Directive, produce: Produce) -> Outcome:
        key = d.idempotency_key
        if key is None:
            return await produce(None)
        joined = self._inflight.get(key)
        if joined is not None:
            check_binding(d, joined[0], joined[1])
            log.info("directive.joined", key=key, **{"directive/id": d.directive_id})
            return await asyncio.shield(joined[2])
        # Claimed before the first await, so concurrent first attempts join this one.
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_observe)
        self._inflight[key] = (d.action_id, params_digest(d), fut)
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
        # Bound to the first attempt's action and parameters: a mismatch runs nothing
        # and is never handed that attempt's outcome.
        bound = await asyncio.to_thread(self._audit.key_binding, key, since)
        if bound is not None:
            check_binding(d, *bound)
        stored = await asyncio.to_thread(self._audit.outcome_for_key, key, since)
        if stored is None:
            prior = await asyncio.to_thread(self._audit.prior_dispatch, key, since)
            if prior is None:
                return await produce(None)
            log.info(
                "directive.rejoining",
                key=key,
                first=prior.directive_id,
                settled=prior.settled or "never",
                **{"directive/id": d.directive_id},
            )
            return await produce(prior)
        check_binding(d, stored.action_id, None)
        log.info(
            "directive.deduplicated",
            key=key,
            receipt=f"outcome:{stored.outcome_id}",
            **{"directive/id": d.directive_id},
        )
        return stored


def _observe(fut: asyncio.Future[Outcome]) -> None:
    # Nobody may be waiting on a failed first attempt; that is not an error to report.
    if not fut.cancelled():
        fut.exception()
