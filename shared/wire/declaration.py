"""The action declaration an operator writes in the OS connector's catalog (seed 048)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import msgspec

from sensorium.shared.signer.protocol import DOMAIN_PATTERN
from sensorium.shared.wire.base import Message

ACTION_ID_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+\Z"
# The published ``sensorium-observation.v1`` patterns: each '/'-separated segment of a
# kind is a dotted chain of lowercase tokens (``release``, ``ai.orbiplex.os/fetch``); a
# family has no dots (the community-common namespace).
SIGNAL_KIND_PATTERN = (
    r"^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)*(/[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)*)*\Z"
)
SIGNAL_FAMILY_PATTERN = r"^[a-z][a-z0-9-]*(/[a-z0-9-]+)*\Z"
SignalKindText = Annotated[str, msgspec.Meta(pattern=SIGNAL_KIND_PATTERN, max_length=256)]
# The published sensitivity vocabulary, least to most restrictive (045's connector
# class table: public-network-reader, feed-reader, OS, filesystem-watcher, camera).
SensitivityClass = Literal[
    "public", "community", "operational-sensitive", "private", "sensitive-personal"
]
SENSITIVITY_CLASSES: tuple[SensitivityClass, ...] = get_args(SensitivityClass)

ActionClass = Literal[
    "read-only-spawn",
    "allowlisted-script",
    "scoped-fs-write",
    "egress-network-spawn",
    "artifact-producing-spawn",
    "composed-spawn",
    "operator-gated-spawn",
]
ExecutionModeSupport = Literal["sync-only", "either", "async-only"]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
AbsPath = Annotated[str, msgspec.Meta(pattern=r"^/", min_length=1, max_length=4096)]
# A whole outcome (both streams, even after U+FFFD expansion of undecodable bytes)
# must fit one 4 MiB frame, so each stream is capped at 1 MiB.
STREAM_CAP_MAX = 1024 * 1024
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*\Z")]
EnvValue = Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*\Z")]


class Executable(Message, frozen=True, kw_only=True):
    kind: Literal["binary", "script"]
    path: AbsPath
    argv_shape: Annotated[
        list[Annotated[str, msgspec.Meta(max_length=4096)]],
        msgspec.Meta(min_length=1, max_length=256),
    ]
    interpreter: AbsPath | None = None
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")] | None = None


class OutputLimits(Message, frozen=True, kw_only=True):
    stdout_max_bytes: Annotated[int, msgspec.Meta(ge=0, le=STREAM_CAP_MAX)] = 65536
    stderr_max_bytes: Annotated[int, msgspec.Meta(ge=0, le=STREAM_CAP_MAX)] = 65536
    # RLIMIT_DATA of each process of the action; never above the node's
    # sandbox.max_memory_bytes (the smaller of the two applies).
    memory_max_bytes: PositiveInt | None = None


class ScriptBlock(Message, frozen=True, kw_only=True):
    allowed_roots: Annotated[list[AbsPath], msgspec.Meta(min_length=1)]


class FsWrite(Message, frozen=True, kw_only=True):
    write_root: AbsPath
    max_bytes_total: PositiveInt
    max_bytes_per_file: PositiveInt
    # Files and directories the run may create or change: an inode cap on its upper
    # layer, and a cap the commit checks (thousands of empty files cost no bytes).
    max_files: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1024
    path_pattern: str | None = None


class Endpoint(Message, frozen=True, kw_only=True):
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)]
    protocol: Literal["tcp", "udp", "https", "http"]


class EgressNetwork(Message, frozen=True, kw_only=True):
    endpoints: Annotated[list[Endpoint], msgspec.Meta(min_length=1)]
    max_bytes_total: PositiveInt
    max_bytes_per_connection: PositiveInt


class ArtifactBlock(Message, frozen=True, kw_only=True):
    max_count: PositiveInt
    max_bytes_per: PositiveInt
    max_bytes_total: PositiveInt
    allowed_media_types: Annotated[list[str], msgspec.Meta(min_length=1)]


ComposedEffect = Literal["read", "scoped-fs-write", "egress-network", "artifact-produce"]


class Composed(Message, frozen=True, kw_only=True):
    effects: Annotated[list[ComposedEffect], msgspec.Meta(min_length=1)]


class Environment(Message, frozen=True, kw_only=True):
    inherit: bool = False
    set: dict[EnvName, EnvValue] = msgspec.field(default_factory=dict)


# A domain tag (``git.commit.v1``): the signer protocol's own pattern. msgspec matches
# it with ``re.search``, where ``$`` also passes a trailing newline; the catalog checks
# each domain again with ``protocol.valid_domain`` (fullmatch: catalog/signing.py).
SIGNING_DOMAIN_PATTERN = DOMAIN_PATTERN
# Hard caps of one directive's scoped signer grant: a declaration asking for more is
# refused at load (a grant is for a handful of signatures, never a signing oracle).
SIGNING_MAX_SIGNATURES = 64
SIGNING_MAX_DOMAINS = 16
SigningKeyKind = Literal["primary-participant", "proxy", "derived"]
SIGNING_KEY_KINDS: tuple[str, ...] = get_args(SigningKeyKind)


class Signing(Message, frozen=True, kw_only=True):
    """A scoped, per-directive signer grant (seed 048): core and its signer enforce it;
    the connector only hands the action the grant's channel (core/signer/)."""

    allowed_domains: Annotated[
        list[Annotated[str, msgspec.Meta(pattern=SIGNING_DOMAIN_PATTERN, max_length=128)]],
        msgspec.Meta(min_length=1, max_length=SIGNING_MAX_DOMAINS),
    ]
    # ``kind`` is one of SIGNING_KEY_KINDS (checked at load with every other problem:
    # connectors/os/catalog/signing.py); ``derived`` also names a ``label``.
    key_ref: dict[str, Any]
    max_signatures: Annotated[int, msgspec.Meta(ge=1, le=SIGNING_MAX_SIGNATURES)]


class ResultContract(Message, frozen=True, kw_only=True):
    stdout_format: Literal["text", "json"] = "text"
    result_pointer_fields: list[str] = msgspec.field(default_factory=list)
    pointer_fields: list[str] = msgspec.field(default_factory=list)
    signal_kind: SignalKindText | None = None
    signal_family: Annotated[str, msgspec.Meta(pattern=SIGNAL_FAMILY_PATTERN)] | None = None
    # What the observation is about: ``subject/kind`` as declared, ``subject/id`` the
    # value of the named result pointer (so only a declared pointer can become one).
    subject_kind: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None
    subject_pointer: str | None = None

    def __post_init__(self) -> None:
        if (self.subject_kind is None) != (self.subject_pointer is None):
            raise ValueError("subject_kind and subject_pointer are declared together")
        if self.subject_pointer is not None and self.subject_pointer not in (
            *self.result_pointer_fields,
            *self.pointer_fields,
        ):
            raise ValueError(
                f"subject_pointer {self.subject_pointer!r} must be one of the declared "
                "result_pointer_fields or pointer_fields"
            )


# Written into the JSON Schema where ResultContract is defined (schemagen.CONSTRAINTS).
SUBJECT_TOGETHER: dict[str, Any] = {
    "dependentRequired": {"subject_kind": ["subject_pointer"], "subject_pointer": ["subject_kind"]}
}


class DeclaredSensitivity(Message, frozen=True, kw_only=True):
    """Raises an action's observations above its class baseline; never lowers them."""

    class_: SensitivityClass = msgspec.field(name="class")


class DeferredProfile(Message, frozen=True, kw_only=True):
    """Hints for deferred runs of an action; the host clamps them (``DeferredHostPolicy``)."""

    preferred_retry_after_seconds: PositiveInt | None = None
    preferred_max_ttl_seconds: PositiveInt | None = None
    # Work that must not be interrupted once accepted says why here: its operations
    # then carry this reason instead of a cancel_href.
    cancel_unavailable_reason: Annotated[str, msgspec.Meta(min_length=1, max_length=500)] | None = (
        msgspec.field(name="cancel/unavailable-reason", default=None)
    )


class Declaration(Message, frozen=True, kw_only=True):
    """One entry of ``action_catalog``."""

    action_id: Annotated[str, msgspec.Meta(pattern=ACTION_ID_PATTERN, max_length=128)]
    connector_id: str = "sensorium-os"
    class_: ActionClass = msgspec.field(name="class")
    executable: Executable
    parameters_schema: dict[str, Any]
    default_timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=86_400_000)] = 30_000
    max_timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=86_400_000)] = 60_000
    limits: OutputLimits = msgspec.field(default_factory=OutputLimits)
    script: ScriptBlock | None = None
    fs_write: FsWrite | None = None
    egress_network: EgressNetwork | None = None
    artifact: ArtifactBlock | None = None
    composed: Composed | None = None
    environment: Environment = msgspec.field(default_factory=Environment)
    signing: Signing | None = None
    result_contract: ResultContract = msgspec.field(default_factory=ResultContract)
    connector_incidental_effects: list[str] = msgspec.field(default_factory=list)
    description: str | None = None
    rationale: str | None = None
    group: str | None = None
    execution_mode_support: ExecutionModeSupport = "sync-only"
    deferred_profile: DeferredProfile | None = None
    fs_profile: str | None = None
    # Absent rather than null: a wrong class is then reported as itself, with the five
    # accepted ones named, not as "not valid under any of the given schemas".
    sensitivity: DeclaredSensitivity | msgspec.UnsetType = msgspec.UNSET
    # ADR-011: fail closed. What the operator accepts to give up where this node cannot
    # enforce it, named one by one; the action is then `degraded`, never `enabled`.
    # "deny-glob": a deny by pattern inside a granted tree stays readable.
    allow_fallback: list[Literal["deny-glob"]] = msgspec.field(default_factory=list)


class ConnectorConfig(Message, frozen=True, kw_only=True):
    """The OS connector's configuration file (factory default, operator file, drop-ins)."""

    schema: Literal["sensorium-os-config.v1"] = "sensorium-os-config.v1"
    allow_unsigned_bootstrap: bool = False
    action_catalog: list[dict[str, Any]] = msgspec.field(default_factory=list)
    # The fs policy (schema v2, `sensorium-fs-policy.v2`) declarations' fs_profile names.
    policy: dict[str, Any] | None = None
