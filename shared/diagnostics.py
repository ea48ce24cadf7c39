"""Stable diagnostic codes: what routing, dashboards, tests and audit branch on.

Two vocabularies, each published as a schema in ``schemas/``:

* ``sensorium-os-error-codes.v1`` — exactly the eleven codes of the action-class
  contract; the OS connector grows no ad-hoc strings outside it.
* ``sensorium-runtime-error-codes.v1`` — transport and runtime conditions that are
  nobody's action: overload, an unreachable peer, a malformed frame.
"""

from __future__ import annotations

from enum import StrEnum


class OsErrorCode(StrEnum):
    ACTION_CATALOG_UNAUTHORIZED = "action-catalog-unauthorized"
    ACTION_NOT_ALLOWLISTED = "action-not-allowlisted"
    SCRIPT_HASH_MISMATCH = "script-hash-mismatch"
    WORKING_DIRECTORY_FORBIDDEN = "working-directory-forbidden"
    PARAMETERS_SCHEMA_INVALID = "parameters-schema-invalid"
    RESULT_SCHEMA_INVALID = "result-schema-invalid"
    RESULT_POINTER_MISSING = "result-pointer-missing"
    ACTION_TIMEOUT = "action-timeout"
    DIRECTIVE_MISSING = "directive-missing"
    PARAMETERS_INVALID = "parameters-invalid"
    SCRIPT_NOT_EXECUTABLE = "script-not-executable"


class RuntimeErrorCode(StrEnum):
    REQUEST_MALFORMED = "request-malformed"
    REQUEST_TOO_LARGE = "request-too-large"
    OVERLOADED = "overloaded"
    REPLY_TIMEOUT = "reply-timeout"
    # A reply that does not decode as what was asked for: a peer of another version.
    REPLY_MALFORMED = "reply-malformed"
    CORE_UNAVAILABLE = "core-unavailable"
    CONNECTOR_UNAVAILABLE = "connector-unavailable"
    ACTION_NOT_ENABLED = "action-not-enabled"
    EXECUTION_MODE_UNSUPPORTED = "execution-mode-unsupported"
    CATALOG_INVALID = "catalog-invalid"
    SPAWN_FAILED = "spawn-failed"
    CATALOG_STALE = "catalog-stale"
    OPERATION_UNKNOWN = "operation-unknown"
    SHUTTING_DOWN = "shutting-down"
    DEADLINE_EXCEEDED = "deadline-exceeded"
    IDEMPOTENCY_CONFLICT = "idempotency-conflict"
    # The action tried to leave its envelope or exceeded a cap: the effect was not kept.
    ENVELOPE_VIOLATION = "envelope-violation"
    # info: the action ran with less than its class envelope, as its signed declaration's
    # allow_fallback names; the message lists what was given up.
    ENVELOPE_DEGRADED = "envelope-degraded"
    # Deferred operations (seed 055).
    DEFERRED_NOT_ACCEPTED = "deferred-not-accepted"
    OPERATION_NOT_CANCELABLE = "operation-not-cancelable"
    OPERATION_EXPIRED = "operation-expired"
    POLL_ATTEMPTS_EXHAUSTED = "poll-attempts-exhausted"
    # The connector restarted while the job's process ran: its end is not known.
    JOB_LOST = "job-lost"
    FLOW_INVALID = "flow-invalid"
    FLOW_UNKNOWN = "flow-unknown"
    FLOW_STEP_FAILED = "flow-step-failed"
    # An earlier attempt under this idempotency/key may have run and its outcome was
    # lost: it is never run a second time under the same key.
    OUTCOME_IN_DOUBT = "outcome-in-doubt"
    # A CURVE client whose key is allowlisted asked for an action outside its grant.
    GRANT_DENIED = "grant-denied"
    # The action's sensitivity is above what this node lets a caller trigger without
    # consent (``consent.max_sensitivity_without_consent``) and the directive's
    # ``consent/sensitivity`` does not reach it; nothing ran.
    CONSENT_REQUIRED = "consent-required"
    # A signed directive that does not hold (core/authenticity.py); nothing ran.
    # The signature (or its delegation's principal_signature) does not verify.
    SIGNATURE_INVALID = "signature-invalid"
    # The key that signed is not the issuer's: no participant to check it against, or a
    # delegation whose principal is another participant.
    ISSUER_MISMATCH = "issuer-mismatch"
    # The delegation's expires_at has passed by the node's clock.
    DELEGATION_EXPIRED = "delegation-expired"
    # The delegation's grants do not cover the directive's action.
    DELEGATION_NOT_GRANTED = "delegation-not-granted"
    # The state directory cannot be written (disk full, read-only): nothing was done.
    STORAGE_UNAVAILABLE = "storage-unavailable"
    # `sensorium.record.start` while a recording runs: one at a time, stop it first.
    RECORDING_ACTIVE = "recording-active"
    # A recording that cannot be made (its name is taken) or read (not a recording).
    RECORDING_INVALID = "recording-invalid"
    # `sensorium.observation.get` of an id the store does not hold (never, or expired),
    # or one this caller may not read (the two are not told apart).
    OBSERVATION_UNKNOWN = "observation-unknown"
    # info: a directive result's structured result is too large to repeat beside the
    # execution report that carries it (`sensorium/outcome.result.json`).
    RESULT_NOT_INLINED = "result-not-inlined"
    # The scoped signer grant (core/signer/): each refusal is audited.
    # A domain outside the declaration's signing.allowed_domains.
    SIGNER_DOMAIN_REFUSED = "signer-domain-refused"
    # The grant's max_signatures are used up.
    SIGNER_COUNT_EXHAUSTED = "signer-count-exhausted"
    # The grant's directive has ended (or its deadline passed): nothing more is signed.
    SIGNER_GRANT_ENDED = "signer-grant-ended"
    # A token no grant was issued with, or another grant's token on this channel.
    SIGNER_GRANT_UNKNOWN = "signer-grant-unknown"
    # `sensorium-sign` found no grant in its environment, or its signer is gone.
    SIGNER_UNAVAILABLE = "signer-unavailable"
    # A second live connection presented a routing id another connection holds
    # (shared/rpc/identities.py): it is refused while it stays open.
    ROUTING_ID_IN_USE = "routing-id-in-use"
    # The `sensorium` command's own, never on the wire: a node file it reads is unusable
    # (node.json, a key file, the state directory), a grant names nothing the catalog
    # has, a CURVE client or an orphan event it was asked about does not exist.
    CONFIG_INVALID = "config-invalid"
    GRANT_UNKNOWN = "grant-unknown"
    CLIENT_UNKNOWN = "client-unknown"
    ORPHAN_UNKNOWN = "orphan-unknown"
    INTERNAL = "internal"


ALL_CODES: frozenset[str] = frozenset(c.value for c in OsErrorCode) | frozenset(
    c.value for c in RuntimeErrorCode
)
