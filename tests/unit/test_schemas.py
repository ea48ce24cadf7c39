"""The committed JSON Schemas and the wire Structs agree.

* every ``schemas/*.schema.json`` is a valid draft 2020-12 schema;
* each file is exactly what ``schemagen.generate`` produces (no drift);
* realistic messages encoded by msgspec validate against their schema;
* documents msgspec rejects, the schema rejects too.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
from collections.abc import Callable
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from sensorium.shared.config import NodeConfig
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.wire import schemagen
from sensorium.shared.wire.client_api import (
    ActionView,
    AuditGet,
    AuditQuery,
    CatalogDescribe,
    CatalogView,
    ClientRequest,
    ConnectorHealth,
    Health,
    HealthReply,
    Invoke,
    Ledger,
    LedgerEntry,
    LedgerQuery,
    OperationCancel,
    OperationListRequest,
    OperationStatusRequest,
    RecordingStatus,
)
from sensorium.shared.wire.continuation import Caller, Continuation, ResumePoint
from sensorium.shared.wire.declaration import ConnectorConfig, Declaration
from sensorium.shared.wire.deferred import (
    CANCEL_SURFACE,
    ConnectorDeferred,
    DeferredOperation,
    DeferredOperationStatus,
    OperationList,
    OperationSummary,
)
from sensorium.shared.wire.directive import ArtifactRef, Directive, Issuer, Timing, new_directive
from sensorium.shared.wire.envelope import Reply, WireError
from sensorium.shared.wire.flow import FlowDefinition, FlowStatus, FlowStep
from sensorium.shared.wire.outcome import (
    Diagnostic,
    EvidenceRef,
    FileTouched,
    Outcome,
    ResultBody,
    Sensitivity,
    StreamCapture,
    TranscriptRow,
)
from sensorium.shared.wire.recording import RecordedRequest, RecordingHeader
from sensorium.shared.wire.report import ConnectorAction, ModuleReport, RuntimeProbe
from sensorium.shared.wire.seam import (
    ConnectorCancel,
    ConnectorInvoke,
    ConnectorReport,
    ConnectorStatus,
    SeamRequestUnion,
)
from sensorium.shared.wire.supervisor_api import (
    ChildStatus,
    ControlRequestUnion,
    SupervisorResume,
    SupervisorStatus,
    SupervisorStatusReply,
    SupervisorStop,
)

SCHEMA_DIR: Traversable = importlib.resources.files("sensorium.schemas")
SUFFIX = ".schema.json"
REGENERATE = "run `python -m sensorium.shared.wire.schemagen --write` to regenerate"

OS_ERROR_CODES = [
    "action-catalog-unauthorized",
    "action-not-allowlisted",
    "script-hash-mismatch",
    "working-directory-forbidden",
    "parameters-schema-invalid",
    "result-schema-invalid",
    "result-pointer-missing",
    "action-timeout",
    "directive-missing",
    "parameters-invalid",
    "script-not-executable",
]


def _committed() -> dict[str, Traversable]:
    return {
        entry.name.removesuffix(SUFFIX): entry
        for entry in SCHEMA_DIR.iterdir()
        if entry.name.endswith(SUFFIX)
    }


def _load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SCHEMA_DIR / f"{name}{SUFFIX}").read_text("utf-8"))
    return doc


def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_load(name))


def _root(doc: dict[str, Any]) -> dict[str, Any]:
    """The schema a top-level ``$ref`` points at (msgspec puts every type in ``$defs``)."""
    ref = doc.get("$ref")
    if ref is None:
        return doc
    target: dict[str, Any] = doc["$defs"][ref.removeprefix("#/$defs/")]
    return target


def _factory_config() -> dict[str, Any]:
    path = importlib.resources.files("sensorium.connectors.os") / "factory" / "sensorium-os.json"
    doc: dict[str, Any] = json.loads(path.read_text("utf-8"))
    return doc


# --- (a) (b) (c): the files themselves -------------------------------------------------


@pytest.mark.parametrize("name", sorted(_committed()))
def test_schema_file_is_valid_2020_12(name: str) -> None:
    doc = _load(name)
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert doc["$id"] == f"https://sensorium.dev/schemas/{name}{SUFFIX}"
    assert doc["title"] == name


@pytest.mark.parametrize("name", sorted(schemagen.SCHEMAS))
def test_committed_schema_matches_generator(name: str) -> None:
    entry = SCHEMA_DIR / f"{name}{SUFFIX}"
    assert entry.is_file(), f"schemas/{name}{SUFFIX} is missing; {REGENERATE}"
    assert json.loads(entry.read_text("utf-8")) == schemagen.generate(name), (
        f"schemas/{name}{SUFFIX} is stale; {REGENERATE}"
    )
    assert entry.read_text("utf-8") == schemagen.render(name), (
        f"schemas/{name}{SUFFIX} is not in canonical form; {REGENERATE}"
    )


def test_schema_files_and_registry_match() -> None:
    files = set(_committed())
    registered = set(schemagen.SCHEMAS)
    assert not files - registered, f"schema files without a SCHEMAS entry: {files - registered}"
    assert not registered - files, f"SCHEMAS entries without a file: {registered - files}; " + (
        REGENERATE
    )


def test_cli_write_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert schemagen.main(["--check", str(tmp_path)]) == 1
    assert schemagen.main(["--write", str(tmp_path)]) == 0
    assert schemagen.main(["--check", str(tmp_path)]) == 0
    (tmp_path / f"sensorium-directive.v1{SUFFIX}").write_text("{}\n")
    (tmp_path / f"sensorium-bogus.v1{SUFFIX}").write_text("{}\n")
    capsys.readouterr()
    assert schemagen.main(["--check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "stale" in err and "sensorium-directive.v1" in err
    assert "unexpected" in err and "sensorium-bogus.v1" in err


# --- (d): realistic messages validate ---------------------------------------------------

DIRECTIVE = Directive(
    schema="sensorium-directive.v1",
    schema_v=1,
    directive_id="01JC7Z4D1R3CTV3M0000000001",
    directive_issued_at="2025-01-01T00:00:00Z",
    issuer=Issuer(module_id="orbiplex.arca", node_id="node:did:key:z6MkhaXgBZDvotDkL"),
    action_id="demo.fs.list-directory",
    parameters={"path": "/var/log", "depth": 1, "flags": ["-a"], "nested": {"x": None}},
    timing=Timing(mode="async", timeout_ms=5000),
    deadline_at="2025-01-01T00:00:05Z",
    idempotency_key="list-var-log-1",
    correlation_id="trace-42",
    evidence_inputs=[ArtifactRef(artifact_id="sha256:abc_-1", role="raw-capture", size_bytes=3)],
)
MINIMAL_DIRECTIVE = new_directive("a.b", issuer=Issuer(participant_did_key="did:key:z6Mk1"))

OUTCOME_COMPLETED = Outcome(
    outcome_id="01JC7Z4D1R3CTV3M0000000002",
    directive_id=DIRECTIVE.directive_id,
    action_id=DIRECTIVE.action_id,
    correlation_id="trace-42",
    status="completed",
    argv=["/usr/bin/ls", "-la", "--", "/var/log"],
    exit_code=0,
    started_at="2025-01-01T00:00:00.123456Z",
    duration_ms=12.5,
    timeout_ms=5000,
    stdout=StreamCapture(text="total 0\n", bytes_total=8, bytes_captured=8),
    stderr=StreamCapture(text="", bytes_total=70000, bytes_captured=65536, truncated=True),
    result=ResultBody(json={"entries": [{"name": "syslog", "size": 1}]}, pointers={"/n": 1}),
    incidental_effects=["reads /var/log"],
    sensitivity=Sensitivity(class_="operational-sensitive"),
    files_touched=[FileTouched(path="/tmp/out/a.txt", bytes=10, sha256="0" * 64)],
    network_transcript=[
        TranscriptRow(
            host="example.org",
            port=443,
            protocol="https",
            bytes_sent=100,
            bytes_received=2000,
            duration_ms=30,
        )
    ],
    artifact_refs=[EvidenceRef(id="art-1", role="listing", media_type="text/plain", size=8)],
    diagnostics=[Diagnostic(code="result-pointer-missing", message="no /n", path="/result")],
)

OUTCOME_TIMED_OUT = Outcome(
    outcome_id="01JC7Z4D1R3CTV3M0000000003",
    directive_id="d-2",
    action_id="demo.system.uptime",
    status="timed-out",
    signal=15,
    started_at="2025-01-01T00:00:00Z",
    duration_ms=5000.0,
    timeout_ms=5000,
    diagnostics=[Diagnostic(code=OsErrorCode.ACTION_TIMEOUT, message="ran past 5000 ms")],
    connector_unauthorized=True,
)

MODULE_REPORT = ModuleReport(
    module_id="sensorium-os",
    instance_id="01JC7Z4D1R3CTV3M0000000004",
    started_at="2025-01-01T00:00:00Z",
    config_hash="sha256:" + "a" * 64,
    config_authorized=True,
    config_authorization="factory",
    catalog_exposed=True,
    connector_actions=[
        ConnectorAction(
            action_id="demo.fs.list-directory",
            class_="read-only-spawn",
            description="Lists a directory.",
            group="demo.filesystem",
            parameters_schema={"type": "object", "properties": {"path": {"type": "string"}}},
            default_timeout_ms=5000,
            max_timeout_ms=30000,
            state="enabled",
            source="factory",
        ),
        ConnectorAction(
            action_id="demo.net.fetch",
            class_="egress-network-spawn",
            parameters_schema={},
            default_timeout_ms=5000,
            max_timeout_ms=30000,
            execution_mode_support="either",
            state="unsupported_by_runtime",
            gaps=["no network namespace"],
        ),
    ],
    runtime=RuntimeProbe(
        platform="linux",
        uid=1000,
        mechanisms={"landlock": True, "netns": False},
        classes={"read-only-spawn": "enforced"},
    ),
    diagnostics=[Diagnostic(code="catalog-invalid", message="entry 3", path="/action_catalog/3")],
)

DEFERRED = DeferredOperationStatus(
    operation_id="deferred:sensorium.directive.invoke:op-1",
    operation_kind="sensorium.directive",
    status="running",
    retry_after_seconds=2,
    expires_at="2025-01-01T01:00:00Z",
    updated_at="2025-01-01T00:00:01Z",
    extensions={"attempt_no": 1},
    result={"partial": True},
    diagnostics=[Diagnostic(code="overloaded", message="try later")],
)

CLIENT_REQUESTS: list[object] = [
    Invoke(request_id="r1", directive=DIRECTIVE),
    OperationStatusRequest(request_id="r2", operation_id="op-1"),
    OperationCancel(request_id="r3", operation_id="op-1"),
    OperationListRequest(request_id="r4", limit=10),
    CatalogDescribe(request_id="r5"),
    LedgerQuery(request_id="r6", action_id="demo.fs.stat"),
    AuditGet(request_id="r6a", id="outcome:01JC7Z4D1R3CTV3M0000000003"),
    AuditQuery(request_id="r6b", action_id="demo.fs.stat", status="timed_out", limit=10),
    Health(request_id="r7"),
]

SEAM_REQUESTS: list[object] = [
    ConnectorInvoke(request_id="s1", directive=DIRECTIVE, timeout_ms=5000, config_hash="h"),
    ConnectorStatus(request_id="s2", operation_id="op-1"),
    ConnectorCancel(request_id="s3", operation_id="op-1"),
    ConnectorReport(request_id="s4"),
]

CONTROL_REQUESTS: list[object] = [
    SupervisorStatus(request_id="c1"),
    SupervisorResume(request_id="c2", process="core"),
    SupervisorStop(request_id="c3"),
]

HEALTH = HealthReply(
    process="core",
    instance_id="i-1",
    started_at="2025-01-01T00:00:00Z",
    version="0.1.0",
    inflight=3,
    connector=ConnectorHealth(connected=True, instance_id="i-2", actions=5, catalog_exposed=True),
)

# A JSON reply carries its result as JSON in place; an error reply carries JSON null
# (the Struct's default, MessagePack nil, is not JSON).
REPLY_OK = Reply(request_id="r7", ok=True, result=msgspec.Raw(msgspec.json.encode(HEALTH)))
REPLY_ERROR = Reply(
    request_id="r1",
    ok=False,
    result=msgspec.Raw(b"null"),
    error=WireError(
        code=RuntimeErrorCode.OVERLOADED,
        message="core is at its in-flight limit; retry later",
        path="/directive",
        retry_after_ms=250,
        detail={"inflight": "1024"},
    ),
)

CASES: list[tuple[str, object, object]] = [
    ("sensorium-directive.v1", DIRECTIVE, Directive),
    ("sensorium-directive.v1", MINIMAL_DIRECTIVE, Directive),
    ("sensorium-os-execution.v1", OUTCOME_COMPLETED, Outcome),
    ("sensorium-os-execution.v1", OUTCOME_TIMED_OUT, Outcome),
    ("middleware-module-report.v1", MODULE_REPORT, ModuleReport),
    ("deferred-operation-status.v1", DEFERRED, DeferredOperationStatus),
    *[("sensorium-client-request.v1", r, ClientRequest) for r in CLIENT_REQUESTS],
    *[("sensorium-connector-request.v1", r, SeamRequestUnion) for r in SEAM_REQUESTS],
    *[("sensorium-supervisor-request.v1", r, ControlRequestUnion) for r in CONTROL_REQUESTS],
    ("sensorium-reply.v1", REPLY_OK, Reply),
    ("sensorium-reply.v1", REPLY_ERROR, Reply),
    ("sensorium-health.v1", HEALTH, HealthReply),
    (
        "sensorium-operation-list.v1",
        OperationList(
            operations=[
                OperationSummary(
                    operation_id="op-1",
                    owner_module_id="sensorium-os",
                    capability_id="demo.fs.stat",
                    status="pending",
                    created_at="2025-01-01T00:00:00Z",
                    expires_at="2025-01-01T01:00:00Z",
                    next_poll_at="2025-01-01T00:00:02Z",
                    attempts=1,
                    last_diagnostic="overloaded",
                )
            ]
        ),
        OperationList,
    ),
    (
        "sensorium-catalog-view.v1",
        CatalogView(
            module_id="sensorium-os",
            connector_instance_id="i-2",
            config_hash="h",
            config_authorized=True,
            actions=[
                ActionView(
                    action_id="demo.fs.stat",
                    parameters_schema={"type": "object"},
                    default_timeout_ms=5000,
                    max_timeout_ms=30000,
                    execution_mode_support="sync-only",
                    state="enabled",
                )
            ],
        ),
        CatalogView,
    ),
    (
        "sensorium-capability-ledger.v1",
        Ledger(
            entries=[
                LedgerEntry(
                    id="ledger-1",
                    capabilityRef="demo.fs.stat",
                    declaredBy=["sensorium-os"],
                    negotiatedBy=["sensorium-core"],
                    effectiveState="blocked_by_policy",
                    policyDecisionRef="policy-1",
                    evidenceRefs=["ev-1"],
                    capturedAt="2025-01-01T00:00:00Z",
                )
            ]
        ),
        Ledger,
    ),
    (
        "sensorium-supervisor-status.v1",
        SupervisorStatusReply(
            pid=100,
            started_at="2025-01-01T00:00:00Z",
            state_dir="/var/lib/sensorium",
            children=[
                ChildStatus(name="core", state="ready", pid=101, uptime_s=1.5, rss_bytes=1 << 20),
                ChildStatus(name="os", state="backoff", restarts=2, last_exit="exit 1"),
            ],
        ),
        SupervisorStatusReply,
    ),
    ("sensorium-node-config.v1", NodeConfig(), NodeConfig),
    (
        "sensorium-recording.v1",
        RecordingHeader(
            started_at="2025-01-01T00:00:00.000Z", core_instance_id="01J0", version="0.1.0"
        ),
        RecordingHeader,
    ),
    ("sensorium-recorded-request.v1", RecordedRequest(1500, b"\x80"), RecordedRequest),
    (
        "sensorium-recording-status.v1",
        RecordingStatus(
            active=False,
            path="/var/lib/sensorium/recordings/a.srec",
            started_at="2025-01-01T00:00:00.000Z",
            requests=3,
            bytes=400,
            max_requests=10,
            max_bytes=1000,
            stopped_reason="max-requests",
        ),
        RecordingStatus,
    ),
]


def _case_id(case: tuple[str, object, object]) -> str:
    return f"{case[0]}:{type(case[1]).__name__}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_encoded_message_validates(case: tuple[str, object, object]) -> None:
    name, message, decode_type = case
    encoded = msgspec.json.encode(message)
    jsonschema.validate(json.loads(encoded), _load(name), cls=jsonschema.Draft202012Validator)
    assert msgspec.json.decode(encoded, type=decode_type) == message


def test_first_factory_declaration_validates() -> None:
    entry = _factory_config()["action_catalog"][0]
    declaration = msgspec.convert(entry, Declaration)
    encoded = json.loads(msgspec.json.encode(declaration))
    _validator("sensorium-action-declaration.v1").validate(encoded)
    _validator("sensorium-action-declaration.v1").validate(entry)


def test_factory_catalog_validates() -> None:
    doc = _factory_config()
    _validator("sensorium-os-config.v1").validate(doc)
    msgspec.convert(doc, ConnectorConfig)
    for index, entry in enumerate(doc["action_catalog"]):
        errors = list(_validator("sensorium-action-declaration.v1").iter_errors(entry))
        assert not errors, f"factory action_catalog[{index}]: {errors[0].message}"
        msgspec.convert(entry, Declaration)


# --- (e): what msgspec rejects, the schema rejects -------------------------------------

_DIRECTIVE_DOC: dict[str, Any] = json.loads(msgspec.json.encode(DIRECTIVE))


def _directive_no_issuer(doc: dict[str, Any]) -> None:
    del doc["issuer"]


def _directive_no_issued_at(doc: dict[str, Any]) -> None:
    del doc["directive/issued_at"]


def _directive_issuer_anonymous(doc: dict[str, Any]) -> None:
    doc["issuer"] = {"node_id": "node:did:key:z6Mk1"}


def _directive_no_timeout(doc: dict[str, Any]) -> None:
    del doc["timing"]["timeout_ms"]


def _directive_bad_action_id(doc: dict[str, Any]) -> None:
    doc["action_id"] = "Demo.Uptime"


def _directive_delegation_unsigned(doc: dict[str, Any]) -> None:
    doc["issuer_delegation"] = {
        "delegation_id": "delegation:key:1",
        "proxy_key": "did:key:z6Mk1",
        "principal_key": "did:key:z6Mk2",
        "grants": {"sensorium.directive.invoke": ["demo.fs.list-directory"]},
        "expires_at": "2030-01-01T00:00:00Z",
        "principal_signature": "c2ln",
    }


def _directive_artifact_role(doc: dict[str, Any]) -> None:
    doc["evidence/inputs"][0]["role"] = "artifact"


def _directive_no_id(doc: dict[str, Any]) -> None:
    del doc["directive/id"]


def _directive_timing_later(doc: dict[str, Any]) -> None:
    doc["timing"]["mode"] = "later"


def _directive_timeout_zero(doc: dict[str, Any]) -> None:
    doc["timing"]["timeout_ms"] = 0


def _directive_wrong_schema(doc: dict[str, Any]) -> None:
    doc["schema"] = "sensorium-directive.v2"


def _declaration_teleport(doc: dict[str, Any]) -> None:
    doc["class"] = "teleport"


def _declaration_relative_path(doc: dict[str, Any]) -> None:
    doc["executable"]["path"] = "usr/bin/ls"


def _declaration_bad_action_id(doc: dict[str, Any]) -> None:
    doc["action_id"] = "NoDots"


NEGATIVE = [
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_no_id),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_no_issuer),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_no_issued_at),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_issuer_anonymous),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_no_timeout),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_bad_action_id),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_delegation_unsigned),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_artifact_role),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_timing_later),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_timeout_zero),
    ("sensorium-directive.v1", Directive, _DIRECTIVE_DOC, _directive_wrong_schema),
    (
        "sensorium-action-declaration.v1",
        Declaration,
        _factory_config()["action_catalog"][0],
        _declaration_teleport,
    ),
    (
        "sensorium-action-declaration.v1",
        Declaration,
        _factory_config()["action_catalog"][0],
        _declaration_relative_path,
    ),
    (
        "sensorium-action-declaration.v1",
        Declaration,
        _factory_config()["action_catalog"][0],
        _declaration_bad_action_id,
    ),
]


@pytest.mark.parametrize(
    ("name", "struct", "base", "mutate"),
    NEGATIVE,
    ids=[m.__name__.lstrip("_") for *_, m in NEGATIVE],
)
def test_both_reject(
    name: str, struct: type, base: dict[str, Any], mutate: Callable[[dict[str, Any]], None]
) -> None:
    validator = _validator(name)
    # The unmutated document is accepted by both, so the rejection is the mutation's.
    validator.validate(base)
    msgspec.json.decode(json.dumps(base), type=struct)

    doc = copy.deepcopy(base)
    mutate(doc)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(doc), type=struct)
    assert not validator.is_valid(doc), f"schema {name} accepted {doc!r}"


def test_client_request_unknown_method_rejected() -> None:
    doc = {"method": "sensorium.directive.teleport", "request/id": "r1"}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(doc), type=ClientRequest)
    assert not _validator("sensorium-client-request.v1").is_valid(doc)


# --- (f): the code vocabularies ---------------------------------------------------------


def test_os_error_codes_are_exactly_the_eleven() -> None:
    codes = _root(_load("sensorium-os-error-codes.v1"))["enum"]
    assert len(codes) == 11
    assert sorted(codes) == sorted(OS_ERROR_CODES)
    assert set(codes) == {code.value for code in OsErrorCode}


def test_runtime_error_codes_match_enum() -> None:
    codes = _root(_load("sensorium-runtime-error-codes.v1"))["enum"]
    assert sorted(codes) == sorted(code.value for code in RuntimeErrorCode)
    assert not set(codes) & set(OS_ERROR_CODES)


# --- (g): deferred operations, continuations, flows (seed 055) -------------------------

# The seed's own examples (its placeholder ids made real: the published pattern has no
# room for '...'); its field names are the contract.
SEED_DEFERRED_OPERATION: dict[str, Any] = {
    "schema": "deferred-operation.v1",
    "schema/v": 1,
    "status": "deferred",
    "operation/id": "deferred:sensorium.directive.invoke:01JC7Z4D1R3CTV3M0000000009",
    "operation/kind": "sensorium.directive.invoke",
    "retry_after_seconds": 5,
    "created_at": "2026-05-05T18:00:00Z",
    "expires_at": "2026-05-05T18:05:00Z",
    "status_href": "/v1/deferred/...",
    "cancel_href": "/v1/deferred/.../cancel",
    "correlation/id": "run:...",
    "audit/outcome-ref": "outcome:...",
    "diagnostics": [],
}
# Seed 002's pending example with what the published closed schema demands: the
# seed-recommended attempt_no under extensions, updated_at (required) present.
SEED_STATUS_PENDING: dict[str, Any] = {
    "schema": "deferred-operation-status.v1",
    "schema/v": 1,
    "operation/id": "deferred:sensorium.directive.invoke:01JC7Z4D1R3CTV3M0000000009",
    "operation/kind": "sensorium.directive.invoke",
    "status": "pending",
    "updated_at": "2026-05-05T18:00:30Z",
    "retry_after_seconds": 10,
    "expires_at": "2026-05-05T18:05:00Z",
    "extensions": {"attempt_no": 2},
    "diagnostics": [],
}
SEED_STATUS_COMPLETED: dict[str, Any] = {
    "schema": "deferred-operation-status.v1",
    "schema/v": 1,
    "operation/id": "deferred:sensorium.directive.invoke:01JC7Z4D1R3CTV3M0000000009",
    "operation/kind": "sensorium.directive.invoke",
    "status": "completed",
    "updated_at": "2026-05-05T18:01:12Z",
    "result": {
        "schema": "sensorium-directive-result.v1",
        "status": "completed",
        "result": {"json": {"redacted_text": "..."}},
    },
    "diagnostics": [],
}
SEED_CONTINUATION: dict[str, Any] = {
    "schema": "orbiplex-continuation.v1",
    "continuation_id": "continuation:...",
    "workflow_run_id": "run:...",
    "step_id": "call_sensorium_directive",
    "deferred_operation_id": "deferred:sensorium.directive.invoke:01JC7Z4D1R3CTV3M0000000009",
    "resume_kind": "json_e_flow_step",
    "resume_point": {
        "executor_id": "json_e_flow",
        "template_id": "template:...",
        "step_index": 3,
        "step_id": "call_sensorium_directive",
        "output_binding": "sensorium_result",
    },
    "caller": {"module_id": "story009.json-e-flow.roles"},
    "capability_id": "sensorium.directive.invoke",
    "context": {},
    "envelope": None,
    "trace": {"correlation/id": "run:..."},
    "idempotency_key": "idem:...",
    "deadline_at": "2026-05-05T18:05:00Z",
    "attempts": 1,
}

SEED_EXAMPLES = [
    ("deferred-operation.v1", DeferredOperation, SEED_DEFERRED_OPERATION),
    ("deferred-operation-status.v1", DeferredOperationStatus, SEED_STATUS_PENDING),
    ("deferred-operation-status.v1", DeferredOperationStatus, SEED_STATUS_COMPLETED),
    ("orbiplex-continuation.v1", Continuation, SEED_CONTINUATION),
]


@pytest.mark.parametrize(
    ("name", "struct", "doc"),
    SEED_EXAMPLES,
    ids=[f"{n}:{i}" for i, (n, *_) in enumerate(SEED_EXAMPLES)],
)
def test_seed_examples_validate(name: str, struct: type, doc: dict[str, Any]) -> None:
    _validator(name).validate(doc)
    decoded: Any = msgspec.json.decode(json.dumps(doc), type=struct)
    # Nothing dropped, nothing renamed: the Struct encodes the same document back.
    again = json.loads(msgspec.json.encode(decoded))
    assert {k: v for k, v in again.items() if k in doc} == doc


OP_ID = "deferred:sensorium.directive.invoke:01JC7Z4D1R3CTV3M0000000009"
HANDLE = DeferredOperation(
    operation_id=OP_ID,
    retry_after_seconds=5,
    created_at="2025-01-01T00:00:00Z",
    expires_at="2025-01-01T00:15:00Z",
    status_href=f"sensorium.operation.status?operation/id={OP_ID}",
    cancel_href=f"sensorium.operation.cancel?operation/id={OP_ID}",
    correlation_id="run:42",
    audit_outcome_ref="outcome:01JC7Z4D1R3CTV3M0000000010",
    extensions={"owner_module_id": "sensorium-os", "capability_id": "sensorium.directive.invoke"},
)
HANDLE_NON_CANCELABLE = DeferredOperation(
    operation_id=OP_ID,
    operation_kind="sensorium.directive.invoke",
    retry_after_seconds=30,
    created_at="2025-01-01T00:00:00Z",
    expires_at="2025-01-01T00:05:00Z",
    cancel_unavailable_reason="the message is already queued at the relay",
    diagnostics=[Diagnostic(code="deferred-profile-clamped", message="ttl 1800 s -> 300 s")],
    extensions={"x-site": {"queue": "mail", "priority": 3}},
)
CONNECTOR_ACK = ConnectorDeferred(
    operation_id=OP_ID,
    status="pending",
    retry_after_seconds=2,
    fail_after_seconds=600,
    created_at="2025-01-01T00:00:00.5Z",
    cancel_href=f"sensorium.connector.cancel?operation/id={OP_ID}",
)
CONNECTOR_ACK_NON_CANCELABLE = ConnectorDeferred(
    operation_id=OP_ID,
    status="completed",  # a resubmitted id answers with its job's current status
    created_at="2025-01-01T00:00:00Z",
    cancel_unavailable_reason="finished before the cancel could reach it",
    extensions={"x-job": {"pid": 4242}},
)
CONTINUATION = Continuation(
    continuation_id="continuation:01JC7Z4D1R3CTV3M0000000011",
    workflow_run_id="run:01JC7Z4D1R3CTV3M0000000012",
    step_id="redact",
    deferred_operation_id=OP_ID,
    resume_point=ResumePoint(
        template_id="template:sha256:" + "b" * 64,
        step_index=1,
        step_id="redact",
        output_binding="redaction",
    ),
    caller=Caller(module_id="sensorium-core.flow-runner"),
    capability_id="sensorium.directive.invoke",
    context={"intake": {"outcome": {"status": "completed", "exit_code": 0}}, "n": [1, 2.5, None]},
    trace={"correlation/id": "run:01JC7Z4D1R3CTV3M0000000012"},
    idempotency_key="flow:run:01JC7Z4D1R3CTV3M0000000012:1",
    deadline_at="2025-01-01T00:15:00Z",
    attempts=2,
    last_diagnostic="still running",
    extensions={"x-trace": {"span": "abc"}},
)
FLOW = FlowDefinition(
    steps=[
        FlowStep(
            step_id="intake",
            action_id="demo.fs.stat",
            parameters={"path": "/etc/hostname"},
            output_binding="intake",
        ),
        FlowStep(
            step_id="redact",
            action_id="demo.slow.redact",
            parameters={"text": {"$eval": "intake.result.json.text"}},
            output_binding="redaction",
            mode="async",
            timeout_ms=600_000,
        ),
    ],
    deferred_response_mode="reject-as-failure",
)
FLOW_STATUS = FlowStatus(
    flow_id="run:01JC7Z4D1R3CTV3M0000000012",
    template_id="template:sha256:" + "b" * 64,
    state="suspended",
    step_index=1,
    steps=2,
    context={"intake": {"status": "completed"}},
    deferred=HANDLE,
    updated_at="2025-01-01T00:00:01Z",
    diagnostics=[Diagnostic(code="deferred", message="waiting on the redaction")],
)

DEFERRED_CASES: list[tuple[str, object, object]] = [
    ("deferred-operation.v1", HANDLE, DeferredOperation),
    ("deferred-operation.v1", HANDLE_NON_CANCELABLE, DeferredOperation),
    ("sensorium-connector-deferred.v1", CONNECTOR_ACK, ConnectorDeferred),
    ("sensorium-connector-deferred.v1", CONNECTOR_ACK_NON_CANCELABLE, ConnectorDeferred),
    ("orbiplex-continuation.v1", CONTINUATION, Continuation),
    (
        "orbiplex-continuation.v1",
        msgspec.structs.replace(CONTINUATION, envelope={"kind": "x"}, extensions=msgspec.UNSET),
        Continuation,
    ),
    ("sensorium-flow.v1", FLOW, FlowDefinition),
    (
        "sensorium-flow.v1",
        FlowDefinition(steps=[FlowStep(step_id="s", action_id="a.b", output_binding="o")]),
        FlowDefinition,
    ),
    ("sensorium-flow-status.v1", FLOW_STATUS, FlowStatus),
    (
        "sensorium-flow-status.v1",
        msgspec.structs.replace(FLOW_STATUS, state="completed", deferred=None, diagnostics=[]),
        FlowStatus,
    ),
    (
        "deferred-operation-status.v1",
        DeferredOperationStatus(
            operation_id=OP_ID,
            status="expired",
            updated_at="2025-01-01T00:20:00Z",
            extensions={"attempt_no": 7},
        ),
        DeferredOperationStatus,
    ),
]


@pytest.mark.parametrize(
    "case", DEFERRED_CASES, ids=[f"{c[0]}:{i}" for i, c in enumerate(DEFERRED_CASES)]
)
def test_deferred_message_validates(case: tuple[str, object, object]) -> None:
    test_encoded_message_validates(case)


def test_the_invariant_sits_where_the_type_is_defined() -> None:
    # In $defs, so it holds wherever the type is embedded, not only at a root.
    for name in (
        "deferred-operation.v1",
        "sensorium-connector-deferred.v1",
        "sensorium-flow-status.v1",
    ):
        for struct, body in _load(name)["$defs"].items():
            if struct in ("DeferredOperation", "ConnectorDeferred"):
                assert body["oneOf"] == CANCEL_SURFACE["oneOf"], (name, struct)


_HANDLE_DOC: dict[str, Any] = json.loads(msgspec.json.encode(HANDLE))
_HANDLE_NC_DOC: dict[str, Any] = json.loads(msgspec.json.encode(HANDLE_NON_CANCELABLE))
_ACK_DOC: dict[str, Any] = json.loads(msgspec.json.encode(CONNECTOR_ACK))
_ACK_NC_DOC: dict[str, Any] = json.loads(msgspec.json.encode(CONNECTOR_ACK_NON_CANCELABLE))
_CONTINUATION_DOC: dict[str, Any] = json.loads(msgspec.json.encode(CONTINUATION))
_FLOW_DOC: dict[str, Any] = json.loads(msgspec.json.encode(FLOW))


def _add_reason(doc: dict[str, Any]) -> None:
    doc["cancel/unavailable-reason"] = "cannot be recalled"


def _add_href(doc: dict[str, Any]) -> None:
    doc["cancel_href"] = "sensorium.operation.cancel?operation/id=x"


def _drop_href(doc: dict[str, Any]) -> None:
    del doc["cancel_href"]


def _drop_reason(doc: dict[str, Any]) -> None:
    del doc["cancel/unavailable-reason"]


def _empty_reason(doc: dict[str, Any]) -> None:
    doc["cancel/unavailable-reason"] = ""


def _unknown_root_field(doc: dict[str, Any]) -> None:
    doc["cancel_reason"] = "a typo of cancel/unavailable-reason"


def _unknown_nested_field(doc: dict[str, Any]) -> None:
    doc["resume_point"]["stack_frame"] = "0x7f00"


def _unknown_step_field(doc: dict[str, Any]) -> None:
    doc["steps"][0]["retry_after_seconds"] = 5


def _extensions_not_an_object(doc: dict[str, Any]) -> None:
    doc["extensions"] = ["x"]


def _retry_zero(doc: dict[str, Any]) -> None:
    doc["retry_after_seconds"] = 0


def _status_not_deferred(doc: dict[str, Any]) -> None:
    doc["status"] = "pending"


def _ack_status_deferred(doc: dict[str, Any]) -> None:
    doc["status"] = "deferred"


def _resume_kind_other(doc: dict[str, Any]) -> None:
    doc["resume_kind"] = "python_stack"


def _flow_mode_other(doc: dict[str, Any]) -> None:
    doc["deferred_response_mode"] = "busy-wait"


def _flow_no_steps(doc: dict[str, Any]) -> None:
    doc["steps"] = []


DEFERRED_NEGATIVE = [
    # exactly one cancellation surface: both present, neither present
    ("deferred-operation.v1", DeferredOperation, _HANDLE_DOC, _add_reason),
    ("deferred-operation.v1", DeferredOperation, _HANDLE_DOC, _drop_href),
    ("deferred-operation.v1", DeferredOperation, _HANDLE_NC_DOC, _add_href),
    ("deferred-operation.v1", DeferredOperation, _HANDLE_NC_DOC, _drop_reason),
    ("deferred-operation.v1", DeferredOperation, _HANDLE_NC_DOC, _empty_reason),
    ("sensorium-connector-deferred.v1", ConnectorDeferred, _ACK_DOC, _add_reason),
    ("sensorium-connector-deferred.v1", ConnectorDeferred, _ACK_DOC, _drop_href),
    ("sensorium-connector-deferred.v1", ConnectorDeferred, _ACK_NC_DOC, _add_href),
    ("sensorium-connector-deferred.v1", ConnectorDeferred, _ACK_NC_DOC, _drop_reason),
    # closed roots
    ("deferred-operation.v1", DeferredOperation, _HANDLE_DOC, _unknown_root_field),
    ("sensorium-connector-deferred.v1", ConnectorDeferred, _ACK_DOC, _unknown_root_field),
    ("orbiplex-continuation.v1", Continuation, _CONTINUATION_DOC, _unknown_root_field),
    ("orbiplex-continuation.v1", Continuation, _CONTINUATION_DOC, _unknown_nested_field),
    ("sensorium-flow.v1", FlowDefinition, _FLOW_DOC, _unknown_root_field),
    ("sensorium-flow.v1", FlowDefinition, _FLOW_DOC, _unknown_step_field),
    ("deferred-operation.v1", DeferredOperation, _HANDLE_DOC, _extensions_not_an_object),
    # the rest of each vocabulary
    ("deferred-operation.v1", DeferredOperation, _HANDLE_DOC, _retry_zero),
    ("deferred-operation.v1", DeferredOperation, _HANDLE_DOC, _status_not_deferred),
    ("sensorium-connector-deferred.v1", ConnectorDeferred, _ACK_DOC, _retry_zero),
    ("sensorium-connector-deferred.v1", ConnectorDeferred, _ACK_DOC, _ack_status_deferred),
    ("orbiplex-continuation.v1", Continuation, _CONTINUATION_DOC, _resume_kind_other),
    ("sensorium-flow.v1", FlowDefinition, _FLOW_DOC, _flow_mode_other),
    ("sensorium-flow.v1", FlowDefinition, _FLOW_DOC, _flow_no_steps),
]


@pytest.mark.parametrize(
    ("name", "struct", "base", "mutate"),
    DEFERRED_NEGATIVE,
    ids=[f"{n}:{m.__name__.lstrip('_')}" for n, _s, _b, m in DEFERRED_NEGATIVE],
)
def test_deferred_both_reject(
    name: str, struct: type, base: dict[str, Any], mutate: Callable[[dict[str, Any]], None]
) -> None:
    test_both_reject(name, struct, base, mutate)


@pytest.mark.parametrize(
    ("name", "struct", "base"),
    [
        ("deferred-operation.v1", DeferredOperation, _HANDLE_DOC),
        ("sensorium-connector-deferred.v1", ConnectorDeferred, _ACK_DOC),
        ("orbiplex-continuation.v1", Continuation, _CONTINUATION_DOC),
        ("deferred-operation-status.v1", DeferredOperationStatus, SEED_STATUS_PENDING),
    ],
)
def test_extensions_are_accepted_by_both(name: str, struct: type, base: dict[str, Any]) -> None:
    doc = copy.deepcopy(base)
    doc["extensions"] = {"x-deployment": {"rack": "b7", "tags": ["a", 1, None]}}
    _validator(name).validate(doc)
    decoded: Any = msgspec.json.decode(json.dumps(doc), type=struct)
    assert decoded.extensions == doc["extensions"]


def test_both_surfaces_in_a_constructor_raise() -> None:
    with pytest.raises(ValueError, match="both present"):
        msgspec.structs.replace(HANDLE, cancel_unavailable_reason="x")
    with pytest.raises(ValueError, match="neither"):
        msgspec.structs.replace(HANDLE, cancel_href=msgspec.UNSET)
    assert HANDLE.cancelable and not HANDLE_NON_CANCELABLE.cancelable


@pytest.mark.parametrize("mutate", [_drop_href, _add_reason], ids=["neither", "both"])
def test_flow_status_rejects_an_embedded_handle_without_one_surface(
    mutate: Callable[[dict[str, Any]], None],
) -> None:
    doc: dict[str, Any] = json.loads(msgspec.json.encode(FLOW_STATUS))
    mutate(doc["deferred"])
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(doc), type=FlowStatus)
    assert not _validator("sensorium-flow-status.v1").is_valid(doc)
