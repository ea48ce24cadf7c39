"""``sensorium-os-execution.v1``: what happened when an action ran, as the connector
reports it (argv, exit code, captures, files touched…).

Core turns it into the published documents: the caller's ``sensorium-directive-result.v1``
(``shared/wire/result.py``, which carries this report as ``sensorium/outcome``) and the
audit's ``sensorium-directive-outcome.v1`` (``shared/wire/audit.py``). Earlier versions
tagged this report ``sensorium-directive-outcome.v1``; that tag is still read."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from sensorium.shared.wire.base import OpenMessage, Timestamp

OutcomeStatus = Literal["completed", "failed", "timed-out"]
SignatureDigest = Annotated[str, msgspec.Meta(pattern=r"^sha256:[A-Za-z0-9_-]+\Z")]


class Diagnostic(OpenMessage, frozen=True, kw_only=True):
    """One coded finding; ``path`` points into the request when the caller can fix it."""

    code: str
    message: str
    path: str | None = None


class StreamCapture(OpenMessage, frozen=True, kw_only=True):
    """A capped capture of stdout or stderr."""

    text: str = ""
    bytes_total: int = 0
    bytes_captured: int = 0
    truncated: bool = False


class FileTouched(OpenMessage, frozen=True, kw_only=True):
    path: str
    bytes: int
    sha256: str | None = None
    deleted: bool = False


class TranscriptRow(OpenMessage, frozen=True, kw_only=True):
    host: str
    port: int
    protocol: str
    bytes_sent: int
    bytes_received: int
    duration_ms: int


class EvidenceRef(OpenMessage, frozen=True, kw_only=True):
    id: str
    role: str
    media_type: str | None = None
    size: int | None = None


class ResultBody(OpenMessage, frozen=True, kw_only=True):
    """The structured result when the declaration says ``stdout_format: json``."""

    json: Any = None
    pointers: dict[str, Any] = msgspec.field(default_factory=dict)


_Ms = Annotated[float, msgspec.Meta(ge=0)]
_Bytes = Annotated[int, msgspec.Meta(ge=0)]


class Accounting(OpenMessage, frozen=True, kw_only=True):
    """What the action's processes used (``connectors/os/run/accounting.py``): cpu and
    peak memory from a delegated cgroup v2 (``source: cgroup-v2``, the whole tree) or
    from rusage (the processes reaped; peak memory is then the largest one's); I/O bytes
    are the bytes its processes passed through read and write calls. null: not
    measurable here."""

    source: Literal["cgroup-v2", "rusage"]
    cpu_user_ms: _Ms | None = None
    cpu_system_ms: _Ms | None = None
    peak_memory_bytes: _Bytes | None = None
    io_read_bytes: _Bytes | None = None
    io_write_bytes: _Bytes | None = None


class Sensitivity(OpenMessage, frozen=True, kw_only=True):
    class_: str = msgspec.field(name="class", default="operational-sensitive")


class SignatureGiven(OpenMessage, frozen=True, kw_only=True):
    """One signature the action's scoped signer grant gave (never its payload)."""

    domain: str
    payload_sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")] = msgspec.field(
        name="payload/sha256"
    )
    key_id: str = msgspec.field(name="key/id")
    # base64url Ed25519 over shared/signer/protocol.py's signed_bytes(domain, digest).
    signature: str


class Outcome(OpenMessage, frozen=True, kw_only=True):
    schema: Literal["sensorium-os-execution.v1", "sensorium-directive-outcome.v1"] = (
        "sensorium-os-execution.v1"
    )
    schema_v: Literal[1] = msgspec.field(name="schema/v", default=1)
    outcome_id: str = msgspec.field(name="outcome/id")
    directive_id: str = msgspec.field(name="directive/id")
    action_id: str
    correlation_id: str | None = msgspec.field(name="correlation/id", default=None)
    status: OutcomeStatus
    argv: list[str] = msgspec.field(default_factory=list)
    exit_code: int | None = None
    signal: int | None = None
    started_at: Timestamp
    duration_ms: float
    timeout_ms: int
    stdout: StreamCapture = msgspec.field(default_factory=StreamCapture)
    stderr: StreamCapture = msgspec.field(default_factory=StreamCapture)
    result: ResultBody | None = None
    incidental_effects: list[str] = msgspec.field(default_factory=list)
    sensitivity: Sensitivity = msgspec.field(default_factory=Sensitivity)
    files_touched: list[FileTouched] = msgspec.field(default_factory=list)
    network_transcript: list[TranscriptRow] = msgspec.field(default_factory=list)
    artifact_refs: list[EvidenceRef] = msgspec.field(default_factory=list)
    diagnostics: list[Diagnostic] = msgspec.field(default_factory=list)
    connector_unauthorized: bool = msgspec.field(name="connector/unauthorized", default=False)
    # sha256:<hex of the signature's 64 bytes> when the directive was signed (and so
    # verified before it ran: core/authenticity.py); links the audit to the signature.
    # Absent (never null) otherwise.
    signature_digest: SignatureDigest | msgspec.UnsetType = msgspec.field(
        name="directive/signature_digest", default=msgspec.UNSET
    )
    # What the directive's scoped signer grant signed (core/signer/); absent when the
    # declaration has no ``signing`` block.
    signatures: list[SignatureGiven] | msgspec.UnsetType = msgspec.UNSET
    # Absent when nothing ran to be measured (the program never started).
    accounting: Accounting | msgspec.UnsetType = msgspec.UNSET

    @property
    def ok(self) -> bool:
        """True when the program ran to completion and exited 0."""
        return self.status == "completed"
