"""The host-owned deferred-operation registry (``storage/deferred-operations.sqlite``).

Core reserves an operation here before the connector sees it and confirms it with
the connector's acknowledgement; the poller claims due operations with leases and
records what each poll found; the operator view reads it alone, so it works with
the poller or the connector down.

Every change is one ``BEGIN IMMEDIATE`` transaction whose ``UPDATE`` is conditional
on the state it expects, so two writers (two pollers, a poller and an operator) can
race without a lost or doubled transition. Times are POSIX seconds passed in by the
caller: the state machine runs on whatever clock the caller has. A transition the
disk cannot take (full, read-only) raises ``storage-unavailable`` and leaves nothing
of itself behind.
"""

from __future__ import annotations

from sensorium.shared.deferred.notes import AttemptNote
from sensorium.shared.deferred.queries import Queries
from sensorium.shared.deferred.records import (
    OPEN,
    Operation,
    Reservation,
    Settled,
    cancel_href,
    status_href,
    unknown,
)
from sensorium.shared.deferred.reservations import Reservations
from sensorium.shared.deferred.transitions import Transitions

# The rows' types travel with the state machine that hands them out.
__all__ = [
    "OPEN",
    "AttemptNote",
    "Operation",
    "Registry",
    "Reservation",
    "Settled",
    "cancel_href",
    "status_href",
    "unknown",
]


class Registry(Queries, Reservations, Transitions):
    """The registry's state machine over one apsw connection (thread-safe): reads
    (``queries.py``), admission (``reservations.py``), the transitions after it
    (``transitions.py``), all over one connection (``base.py``)."""
