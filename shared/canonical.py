"""Canonical JSON (RFC 8785 JCS) and its SHA-256, for hashes that must agree everywhere."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    """The JCS serialization of a JSON value."""
    return bytes(rfc8785.dumps(value))


def sha256_hex(value: Any) -> str:
    """Hex SHA-256 of the canonical form of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
