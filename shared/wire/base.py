"""Struct base classes shared by every wire message."""

from __future__ import annotations

from typing import Annotated

import msgspec


# Closed roots: an unknown field is a typo or a newer writer, and either way the
# reader must say so instead of silently dropping it.
class Message(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A closed, immutable, keyword-only wire document."""


class OpenMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A wire document that tolerates fields added by newer writers (replies, reports)."""


RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Timestamp = Annotated[
    str,
    msgspec.Meta(description="RFC 3339 UTC timestamp", extra_json_schema={"format": "date-time"}),
]
