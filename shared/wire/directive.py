"""``sensorium-directive.v1``: what a caller asks core to do."""

from __future__ import annotations

from itertools import chain
from typing import Annotated, Any, Literal

import msgspec

from sensorium.shared.clock import parse_rfc3339, rfc3339
from sensorium.shared.diagnostics import OsErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.wire.base import OpenMessage, Timestamp
from sensorium.shared.wire.declaration import SensitivityClass

TimingMode = Literal["sync", "async"]

# Parameters are validated, logged and re-encoded on every hop, by code that recurses:
# values nested past this cap are refused where a directive is decoded or built, before
# any of that (at ~980 levels core's validator died in RecursionError, an `internal`).
# Their size is bounded by the request's (4 MiB) and, once rendered, by the argv's.
PARAMETERS_MAX_DEPTH = 64  # ``parameters`` itself is level 1
_SCALARS = frozenset({str, int, float, bool, type(None), bytes})
_NESTED = (dict, list, tuple)


class ParametersRefused(CodedError, ValueError):
    """``parameters-invalid`` for parameters no hop could carry. A ValueError too, so that
    decoding turns it into a ``msgspec.ValidationError`` (``request-malformed``) while
    code building a directive sees the coded error itself."""

    def __init__(self, message: str) -> None:
        super().__init__(OsErrorCode.PARAMETERS_INVALID, message, path="$.parameters")


def parameters_problem(parameters: dict[str, Any]) -> str | None:
    """Why ``parameters`` break the cap (or cannot travel at all), else ``None``."""
    try:
        msgspec.msgpack.encode(parameters)
    except RecursionError:
        return f"parameters are nested more than {PARAMETERS_MAX_DEPTH} levels deep"
    except (TypeError, ValueError, OverflowError) as exc:
        return f"parameters cannot be encoded: {exc!s:.200}"
    level: list[Any] = [parameters]
    for _ in range(PARAMETERS_MAX_DEPTH):
        level = _deeper(level)
        if not level:
            return None
    return f"parameters are nested more than {PARAMETERS_MAX_DEPTH} levels deep"


def _deeper(level: list[Any]) -> list[Any]:
    """The containers one level below ``level``, a whole level at a time at C speed."""
    dicts = [node for node in level if isinstance(node, dict)]
    if dicts:
        rest = [node for node in level if not isinstance(node, dict)]
        parts = [*rest, *dicts, *(d.values() for d in dicts)]
    else:
        parts = level
    items = list(chain.from_iterable(parts))
    if _SCALARS.issuperset(map(type, items)):
        return []
    return [item for item in items if isinstance(item, _NESTED)]


# The published schema is open (additionalProperties: true) at the root and in
# ``issuer``, ``timing``, ``parameters``, each evidence input, ``issuer_delegation`` and
# ``signature``: a field this node does not know is carried, never refused. Optional
# fields are omitted when absent (``omit_defaults``), never sent as ``null``.
ACTION_ID_PATTERN = r"^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)*\Z"
DID_KEY_PATTERN = r"^did:key:z[1-9A-HJ-NP-Za-km-z]+\Z"
PARTICIPANT_PATTERN = r"^(participant:)?did:key:z[1-9A-HJ-NP-Za-km-z]+\Z"
NODE_ID_PATTERN = r"^node:did:key:z[1-9A-HJ-NP-Za-km-z]+\Z"
ARTIFACT_ID_PATTERN = r"^(sha256:[A-Za-z0-9_-]+|memarium-blob:[A-Za-z0-9._:/-]+)\Z"
ArtifactRole = Literal["stdout", "stderr", "produced-file", "raw-capture"]


class Issuer(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    """Who invokes: ``module_id`` (a local module) and/or ``participant/did:key``.

    At least one of the two. Claimed, not proven by this Struct: a signature proves a
    participant (``core/authenticity.py``), a CURVE key's binding limits the module ids
    it may claim (``core/grants.py``); over ipc it is the operator's label."""

    module_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    participant_did_key: Annotated[str, msgspec.Meta(pattern=PARTICIPANT_PATTERN)] | None = (
        msgspec.field(name="participant/did:key", default=None)
    )
    node_id: Annotated[str, msgspec.Meta(pattern=NODE_ID_PATTERN)] | None = None

    def __post_init__(self) -> None:
        if self.module_id is None and self.participant_did_key is None:
            raise ValueError("issuer names neither module_id nor participant/did:key")

    @property
    def name(self) -> str:
        """How logs and audit name the issuer (as claimed)."""
        return self.module_id or self.participant_did_key or ""


class ArtifactRef(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    """An input passed by reference (045's minimal artifact-lane contract)."""

    artifact_id: Annotated[str, msgspec.Meta(pattern=ARTIFACT_ID_PATTERN)] = msgspec.field(
        name="artifact/id"
    )
    role: ArtifactRole
    media_type: str | None = None
    size_bytes: Annotated[int, msgspec.Meta(ge=0)] | None = None


class Ed25519Signature(OpenMessage, frozen=True, kw_only=True):
    alg: Literal["ed25519"]
    value: Annotated[str, msgspec.Meta(min_length=1)]


class DelegationProof(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    """Proposal 032's compact proof; Sensorium v1 accepts ``max_chain_depth`` 0 only."""

    delegation_id: Annotated[str, msgspec.Meta(min_length=1, pattern="^delegation:key:")]
    proxy_key: Annotated[str, msgspec.Meta(pattern=DID_KEY_PATTERN)]
    principal_key: Annotated[str, msgspec.Meta(pattern=DID_KEY_PATTERN)]
    grants: Annotated[
        dict[
            str,
            Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)],
        ],
        msgspec.Meta(min_length=1),
    ]
    expires_at: Timestamp
    max_chain_depth: Literal[0] | None = None
    principal_signature: Annotated[str, msgspec.Meta(min_length=1)]


class Timing(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    """``timeout_ms`` is the caller's end-to-end budget; core clamps it to the action's
    ``max_timeout_ms``. ``deadline_at`` here is this node's earlier spelling of the
    directive's top-level ``deadline_at``, still accepted (the earlier of the two wins)."""

    mode: TimingMode
    timeout_ms: Annotated[int, msgspec.Meta(ge=1)]
    deadline_at: Timestamp | None = None


class Directive(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    """``sensorium-directive.v1`` as published: required fields are required here too.

    ``signature`` and ``issuer_delegation`` are decoded here and verified by core
    before anything runs (``core/authenticity.py``, against the document as sent)."""

    schema: Literal["sensorium-directive.v1"]
    schema_v: Literal[1] = msgspec.field(name="schema/v")
    directive_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = msgspec.field(
        name="directive/id"
    )
    directive_issued_at: Timestamp = msgspec.field(name="directive/issued_at")
    issuer: Issuer
    action_id: Annotated[str, msgspec.Meta(max_length=128, pattern=ACTION_ID_PATTERN)]
    parameters: dict[str, Any]
    timing: Timing
    deadline_at: Timestamp | None = None
    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = (
        msgspec.field(name="idempotency/key", default=None)
    )
    correlation_id: Annotated[str, msgspec.Meta(max_length=128)] | None = msgspec.field(
        name="correlation/id", default=None
    )
    evidence_inputs: list[ArtifactRef] | None = msgspec.field(name="evidence/inputs", default=None)
    issuer_delegation: DelegationProof | None = None
    signature: Ed25519Signature | None = None
    # Project field (the published root is open): the issuer's explicit consent to
    # trigger an action up to this sensitivity class (``core/consent.py``); covered by
    # the signature when the directive is signed.
    consent_sensitivity: SensitivityClass | None = msgspec.field(
        name="consent/sensitivity", default=None
    )

    def __post_init__(self) -> None:
        try:
            parse_rfc3339(self.directive_issued_at)
        except ValueError:
            raise ValueError(
                "directive/issued_at is not an RFC 3339 timestamp with an offset"
            ) from None
        if self.issuer_delegation is not None and self.signature is None:
            raise ValueError("issuer_delegation needs a signature (by its proxy_key)")
        if self.parameters and (problem := parameters_problem(self.parameters)) is not None:
            raise ParametersRefused(problem)

    @property
    def caller_deadline_at(self) -> str | None:
        """The caller's deadline: the top-level ``deadline_at`` or the earlier
        ``timing.deadline_at`` alias; both given, the earlier of the two."""
        top, alias = self.deadline_at, self.timing.deadline_at
        if top is None or alias is None:
            return top if top is not None else alias
        try:
            return top if parse_rfc3339(top) <= parse_rfc3339(alias) else alias
        except ValueError:
            return top  # admission names the malformed one


# The JSON Schema states what __post_init__ checks (added where schemagen defines them).
ISSUER_NAMED: dict[str, Any] = {
    "anyOf": [{"required": ["participant/did:key"]}, {"required": ["module_id"]}]
}
DELEGATION_NEEDS_SIGNATURE: dict[str, Any] = {
    "dependentRequired": {"issuer_delegation": ["signature"]}
}
DEFAULT_TIMEOUT_MS = 30_000
"""What a client sends as ``timing.timeout_ms`` when neither its caller nor the catalog
names one (core clamps it to the action's maximum)."""


def new_directive(
    action_id: str,
    parameters: dict[str, Any] | None = None,
    *,
    issuer: Issuer,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    mode: TimingMode = "sync",
    deadline_at: str | None = None,
    idempotency_key: str | None = None,
    correlation_id: str | None = None,
    directive_id: str | None = None,
    consent: SensitivityClass | None = None,
) -> Directive:
    """A contract-valid directive issued now (a fresh ULID unless ``directive_id``)."""
    return Directive(
        schema="sensorium-directive.v1",
        schema_v=1,
        directive_id=directive_id or new_id(),
        directive_issued_at=rfc3339(),
        issuer=issuer,
        action_id=action_id,
        parameters=dict(parameters or {}),
        timing=Timing(mode=mode, timeout_ms=timeout_ms),
        deadline_at=deadline_at,
        idempotency_key=idempotency_key,
        correlation_id=correlation_id,
        consent_sensitivity=consent,
    )


LEGACY_ISSUER = "sensorium.legacy"
"""The issuer a directive persisted before issuers were required is read as having."""


def decode_stored(data: bytes, timeout_ms: int) -> Directive:
    """A directive this node persisted (MessagePack), including one written before the
    published contract's required fields were: what it lacks is filled in (``issuer``
    :data:`LEGACY_ISSUER`, ``directive/issued_at`` now, ``timing.timeout_ms`` the
    effective one it was accepted with), so an accepted job survives the upgrade."""
    try:
        return msgspec.msgpack.decode(data, type=Directive)
    except msgspec.ValidationError:
        doc = msgspec.msgpack.decode(data)
        if not isinstance(doc, dict):
            raise
    stored = doc.get("timing")
    timing: dict[str, Any] = stored if isinstance(stored, dict) else {}
    doc = {
        **{k: v for k, v in doc.items() if v is not None},
        "schema": "sensorium-directive.v1",
        "schema/v": 1,
        "timing": {
            **{k: v for k, v in timing.items() if v is not None},
            "mode": timing.get("mode") or "sync",
            "timeout_ms": timing.get("timeout_ms") or timeout_ms,
        },
    }
    doc.setdefault("directive/issued_at", rfc3339())
    doc.setdefault("issuer", {"module_id": LEGACY_ISSUER})
    doc.setdefault("parameters", {})
    return msgspec.convert(doc, Directive)
