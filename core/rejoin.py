"""Did an earlier attempt under an ``idempotency/key`` provably never start?

A keyed retry after a crash *rejoins* the earlier attempt (``core/idempotency.py``).
When the connector does not know the key, that attempt is in doubt — unless core
can prove the connector never received it. Proof, from what core already knows:

1. each earlier attempt's dispatch intent names the connector instance core's report
   named when it was sent to be run (instances are sequential: one recorded before
   the send was alive then, so whatever later received it is that instance or a
   newer one); an attempt that only asked to rejoin (``REJOIN_ONLY``) spawns nothing
   and keeps the instance its directive was first sent to;
2. that same instance was seen alive before the rejoin was sent (core's report) and
   again after its refusal came back (a fresh report), so it is the one that refused:
   one instance at a time serves the connector's endpoint, and an instance id is
   never reused;
3. that instance cannot have forgotten the key since: its memory of keys
   (``connectors/os/run/keyed.py``) holds every keyed attempt for ``REMEMBER_S`` and the
   latest ``MAX_REMEMBERED``, and fewer keyed directives than that were dispatched
   after the intent, within that time.

Then the attempt never ran, and never will except through the same instance, whose
key memory makes any later arrival of it join a fresh attempt instead of spawning
twice. So a fresh attempt (no rejoin) is safe and gives the caller a definite
answer instead of ``outcome-in-doubt``. Anything short of that proof stays in doubt.

When an attempt went to an instance that has since died, that proof is out of reach;
the connector's start journal (``connectors/os/run/starts.py``) is asked instead
(``journal_never_started``): every instance writes a row before it spawns (a row that
outlives any process), and an answer of ``never-started`` fences the asked dispatches
so that no instance can start them afterwards. Then nothing ran and nothing will: core
answers ``connector-unavailable`` (retryable) and closes the intents as nothing ran. Started,
unknown (beyond the journal's horizon, or an intent that does not name the seam
request that sent it to be run) or no answer: still in doubt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from sensorium.connectors.os.run.keyed import MAX_REMEMBERED, REMEMBER_S
from sensorium.core.audit import REJOIN_ONLY, AuditStore
from sensorium.shared.clock import parse_rfc3339

log = structlog.get_logger("sensorium.core")
# Room for the connector's clock and core's to disagree, and for attempts in flight.
MARGIN_S = 60.0
MARGIN_KEYS = 64


# The most dispatches one question to the start journal may name (the seam's bound).
MAX_ASKED = 64


async def journal_never_started(
    key: str,
    since: float,
    audit: AuditStore,
    ask: Callable[[tuple[str, ...], str], Awaitable[str | None]],
) -> list[str] | None:
    """The directive ids of every unsettled attempt under ``key``, when the connector's
    start journal answers (and fences) that none of them started; else None.
    ``ask(seam request ids, earliest dispatched_at)`` returns the journal's answer."""
    attempts = await asyncio.to_thread(audit.unsettled_spawns, key, since)
    asked = tuple(r for _d, r, _at in attempts if r is not None)
    if not attempts or len(asked) != len(attempts) or len(asked) > MAX_ASKED:
        return None
    answer = await ask(asked, min(at for _d, _r, at in attempts))
    if answer != "never-started":
        return None
    log.info(
        "directive.rejoin.journal_never_started",
        key=key,
        attempts=len(attempts),
        note="the connector's start journal shows no earlier attempt started (fenced)",
    )
    return [d for d, _r, _at in attempts]


async def never_started(
    key: str,
    since: float,
    seen_before: str | None,
    fetch_instance: Callable[[], Awaitable[str | None]],
    audit: AuditStore,
    now: float,
) -> bool:
    """True only when no attempt under ``key`` can have started (see the module's
    proof): every unsettled attempt either only asked to rejoin, or was sent to the
    connector instance that refused the rejoin. ``seen_before``: the instance core's
    report named before the rejoin was sent; ``fetch_instance`` asks for a fresh one."""
    if seen_before is None:
        return False
    attempts = await asyncio.to_thread(audit.unsettled_dispatches, key, since)
    sent = [(inst, at) for inst, at in attempts if inst != REJOIN_ONLY]
    if any(inst != seen_before for inst, _at in sent):
        return False  # sent to another instance (or one not recorded): it may have run
    if sent:
        first = min(at for _inst, at in sent)
        try:
            age = now - parse_rfc3339(first)
        except ValueError:
            return False
        if age > REMEMBER_S - MARGIN_S:
            return False
        later = await asyncio.to_thread(audit.keyed_dispatches_since, first)
        if later > MAX_REMEMBERED - MARGIN_KEYS:
            return False
    if await fetch_instance() != seen_before:
        return False
    log.info(
        "directive.rejoin.never_started",
        key=key,
        connector_instance=seen_before,
        note="every earlier attempt went to the connector that is alive and never saw it",
    )
    return True
