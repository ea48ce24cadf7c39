"""Authentic issuers: a signed directive is verified before admission (issue 24, item 2).

What is signed (proposal 045, directive envelope; proposal 032, DelegationProof):

- the **directive payload** is the directive document as sent, without ``signature``
  and ``issuer_delegation`` (045: the proof is "excluded from the surrounding directive
  signature payload"), canonicalized as RFC 8785 JSON (JCS); fields this node does not
  know are part of it, so it is taken from the request's bytes, not re-encoded from
  the decoded Struct (which drops them);
- the **proof payload** is the JCS of the compact proof's five fields
  ``delegation_id, proxy_key, principal_key, grants, expires_at`` (032: metadata such
  as ``max_chain_depth`` does not enter it);
- both signatures are Ed25519, their 64 bytes base64url-encoded (padding optional;
  any other character is refused), keys are ``did:key`` (multicodec ed25519-pub).

Who must have signed: without ``issuer_delegation``, the key ``issuer.participant/
did:key`` names. With it (032's verification steps, in its order): its
``principal_key`` must derive to the issuer's participant (both normalized to
``participant:did:key:...``), ``principal_signature`` must verify under it,
``expires_at`` must be later than the node's clock, the directive's signature must
verify under ``proxy_key``, and the proof's grants must cover the action.
``max_chain_depth`` other than 0 never gets here: the published schema's ``const: 0``
refuses it as the request is decoded (``request-malformed``).

Grants: 032's ``grants`` map a grant type to targets. The type this node reads is
``sensorium.directive.invoke`` (045 §7's consumer capability; 045 scopes its grants
"against action_id patterns"); a target is an ``action_id``, ``PREFIX.*`` (every
action under ``PREFIX.``) or ``*``. Other grant types are ignored (032: open world).

Each failure is a ``CodedError`` with a stable code (``shared/diagnostics.py``):
``signature-invalid``, ``issuer-mismatch``, ``delegation-expired``,
``delegation-not-granted``. The outcome of a signed directive carries
``directive/signature_digest``: ``sha256:`` and the lowercase hex SHA-256 of the
signature's 64 decoded bytes (the value exactly as verified).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from sensorium.shared.canonical import canonical_json
from sensorium.shared.clock import parse_rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.didkey import DidKeyError, participant_id, public_key
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.server import PAYLOAD
from sensorium.shared.wire.directive import Directive

GRANT_TYPE = "sensorium.directive.invoke"
EXCLUDED = ("signature", "issuer_delegation")
PROOF_FIELDS = ("delegation_id", "proxy_key", "principal_key", "grants", "expires_at")
SIGNATURE_BYTES = 64
_B64URL = re.compile(r"^[A-Za-z0-9_-]+={0,2}\Z")


def signature_bytes(text: str, what: str, path: str) -> bytes:
    """Strict base64url: the URL-safe alphabet, padding optional, nothing else."""
    try:
        if not _B64URL.match(text):
            raise ValueError("not base64url")
        bare = text.rstrip("=")
        raw = base64.b64decode(bare + "=" * (-len(bare) % 4), altchars=b"-_", validate=True)
    except (ValueError, binascii.Error):
        raise _invalid(f"{what} is not base64url", path) from None
    if len(raw) != SIGNATURE_BYTES:
        raise _invalid(f"{what} is {len(raw)} bytes; an Ed25519 signature is 64", path)
    return raw


def signing_payload(doc: Mapping[str, Any]) -> bytes:
    """The bytes a directive's signature covers (JCS, without the two excluded fields)."""
    return canonical_json({k: v for k, v in doc.items() if k not in EXCLUDED})


def proof_payload(proof: Mapping[str, Any]) -> bytes:
    """The bytes a delegation's ``principal_signature`` covers."""
    return canonical_json({k: proof[k] for k in PROOF_FIELDS if k in proof})


def signature_digest(d: Directive) -> str | None:
    """``directive/signature_digest`` of a directive (None when unsigned)."""
    if d.signature is None:
        return None
    try:
        raw = signature_bytes(d.signature.value, "signature.value", "$.signature.value")
    except CodedError:
        return None  # never verified, so never admitted; nothing to link
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def grant_covers(grants: Mapping[str, list[str]], action_id: str) -> bool:
    for target in grants.get(GRANT_TYPE, ()):
        if target in ("*", action_id):
            return True
        if target.endswith(".*") and action_id.startswith(target[:-1]):
            return True
    return False


def as_sent(d: Directive) -> dict[str, Any]:
    """The directive document as its caller sent it: from the request being handled
    when that is the one carrying ``d`` (its fields unknown here included), else (a
    directive core built itself) ``d`` encoded."""
    payload = PAYLOAD.get()
    if payload is not None:
        try:
            request = msgspec.msgpack.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            request = None
        doc = request.get("directive") if isinstance(request, dict) else None
        if isinstance(doc, dict) and doc.get("directive/id") == d.directive_id:
            return doc
    built: dict[str, Any] = msgspec.to_builtins(d)
    return built


def verify(d: Directive, doc: Mapping[str, Any] | None = None, now: float | None = None) -> None:
    """Refuse ``d`` (``CodedError``) unless it is unsigned or its signature holds.

    ``doc``: the document as sent (default :func:`as_sent`); ``now``: the node clock."""
    if d.signature is None:
        return  # the schema already refuses a delegation without a signature
    doc = as_sent(d) if doc is None else doc
    signature = signature_bytes(d.signature.value, "signature.value", "$.signature.value")
    claimed = d.issuer.participant_did_key
    proof = d.issuer_delegation
    if claimed is None:
        raise CodedError(
            RuntimeErrorCode.ISSUER_MISMATCH,
            "a signed directive must name the signer's participant in "
            "issuer.participant/did:key; a module_id names no key to verify with",
            path="$.issuer",
        )
    if proof is None:
        signer, signer_path = claimed, "$.issuer.participant/did:key"
    else:
        if participant_id(proof.principal_key) != participant_id(claimed):
            raise CodedError(
                RuntimeErrorCode.ISSUER_MISMATCH,
                f"issuer_delegation.principal_key {proof.principal_key[:80]} is not the issuer "
                f"{claimed[:80]}",
                path="$.issuer_delegation.principal_key",
            )
        raw_proof = doc.get("issuer_delegation")
        _check(
            proof.principal_key,
            _canonical(proof_payload, raw_proof if isinstance(raw_proof, Mapping) else {}),
            signature_bytes(
                proof.principal_signature,
                "issuer_delegation.principal_signature",
                "$.issuer_delegation.principal_signature",
            ),
            "issuer_delegation.principal_signature",
            "$.issuer_delegation.principal_signature",
        )
        try:
            expires = parse_rfc3339(proof.expires_at)
        except ValueError:
            raise CodedError(
                RuntimeErrorCode.REQUEST_MALFORMED,
                f"issuer_delegation.expires_at {proof.expires_at[:80]!r} is not an RFC 3339 "
                "timestamp with an offset",
                path="$.issuer_delegation.expires_at",
            ) from None
        if expires <= (time.time() if now is None else now):
            raise CodedError(
                RuntimeErrorCode.DELEGATION_EXPIRED,
                f"the delegation {proof.delegation_id[:80]} expired at {proof.expires_at}",
                path="$.issuer_delegation.expires_at",
            )
        signer, signer_path = proof.proxy_key, "$.issuer_delegation.proxy_key"
    payload = _canonical(signing_payload, doc)
    _check(signer, payload, signature, "signature", "$.signature.value", signer_path)
    if proof is not None and not grant_covers(proof.grants, d.action_id):
        raise CodedError(
            RuntimeErrorCode.DELEGATION_NOT_GRANTED,
            f"the delegation {proof.delegation_id[:80]} does not grant {GRANT_TYPE} "
            f"over {d.action_id}",
            path="$.issuer_delegation.grants",
        )


def _canonical(payload: Callable[[Mapping[str, Any]], bytes], doc: Mapping[str, Any]) -> bytes:
    try:
        return payload(doc)
    except Exception as exc:  # rfc8785 refuses what JSON cannot hold (bytes, NaN, ...)
        raise _invalid(
            f"what is signed cannot be canonicalized as JSON (RFC 8785): {exc!s:.160}",
            "$.signature",
        ) from None


def _check(
    did: str, payload: bytes, signature: bytes, what: str, path: str, key_path: str = ""
) -> None:
    try:
        key = VerifyKey(public_key(did))
    except DidKeyError as exc:
        raise _invalid(f"{what} cannot be checked: {exc}", key_path or path) from None
    try:
        key.verify(payload, signature)
    except BadSignatureError:
        raise _invalid(f"{what} does not verify under {did[:80]}", path) from None


def _invalid(message: str, path: str) -> CodedError:
    return CodedError(RuntimeErrorCode.SIGNATURE_INVALID, message, path=path)
