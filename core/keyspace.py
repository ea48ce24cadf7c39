"""Whose an ``idempotency/key`` is, and what it is bound to (issue 16, item 10).

A key is bound to (caller, action, digest of the canonical parameters):

- **caller**: a CURVE client's key lives in a key space of its own. Core rewrites
  ``idempotency/key`` on the way in to ``curve:<32 hex of the client's public key>/<key>``
  (a long key by its digest), so the audit store, the deferred registry and the
  connector's key memory all keep one client's keys apart from another's: the same
  key from two clients is two keys, and neither ever sees the other's outcome. The
  local operator (ipc, or the node's own key) keeps the key as sent.
- **action and parameters**: the first attempt under a key records its action and
  the SHA-256 of its parameters' RFC 8785 form (``dispatches.params_digest`` in the
  audit store, ``operations.params_digest`` in the registry). A reuse with another
  action or other parameters is refused with ``idempotency-conflict`` and runs
  nothing; the first attempt's outcome is never handed to it.
"""

from __future__ import annotations

import hashlib

import msgspec

from sensorium.shared.canonical import sha256_hex
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.directive import Directive

MAX_KEY = 128  # what sensorium-directive.v1 allows
CLIENT_PREFIX = "curve:"


def params_digest(d: Directive) -> str:
    return "sha256:" + sha256_hex(d.parameters)


def scoped_key(caller_key: str | None, key: str) -> str:
    """``key`` in ``caller_key``'s key space (the operator's, ``None``, is the bare key)."""
    if caller_key is None:
        return key
    space = CLIENT_PREFIX + hashlib.sha256(caller_key.encode()).hexdigest()[:32] + "/"
    if len(space) + len(key) > MAX_KEY:
        key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return space + key


def scoped(d: Directive, caller_key: str | None) -> Directive:
    """``d`` with its idempotency key (if any) in its caller's key space."""
    if d.idempotency_key is None or caller_key is None:
        return d
    return msgspec.structs.replace(d, idempotency_key=scoped_key(caller_key, d.idempotency_key))


def check_binding(d: Directive, first_action: str, first_digest: str | None) -> None:
    """Refuse ``d`` when its key was first used for another action or other parameters
    (a binding recorded before digests were kept checks the action alone)."""
    key = d.idempotency_key
    if first_action != d.action_id:
        raise _conflict(key, f"was first used for {first_action[:128]}, not {d.action_id[:128]}")
    if first_digest is not None and first_digest != params_digest(d):
        raise _conflict(key, f"was first used for {d.action_id[:128]} with other parameters")


def _conflict(key: str | None, what: str) -> CodedError:
    shown = key or ""
    if shown.startswith(CLIENT_PREFIX) and "/" in shown:
        shown = shown.split("/", 1)[1]  # the caller's own key, not its key space
    shown = shown[:128]
    return CodedError(
        RuntimeErrorCode.IDEMPOTENCY_CONFLICT,
        f"idempotency/key {shown!r} {what}; nothing was run. A key names one directive "
        "(its action and parameters): use a fresh key for a different one",
        path="$.idempotency/key",
    )
