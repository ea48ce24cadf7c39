"""Time-ordered identifiers (ULID) for requests, directives, outcomes and operations."""

from __future__ import annotations

from ulid import ULID


def new_id() -> str:
    """A fresh ULID in its canonical 26-character Crockford form."""
    return str(ULID())
