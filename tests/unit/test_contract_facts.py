"""The project's generated schemas state the published v1 contract's facts.

For each name shared with the published contract (``sensorium-directive.v1``,
``sensorium-observation.v1``, ``deferred-operation.v1``, ``deferred-operation-status.v1``)
the facts below — required
fields, enums and consts, patterns, bounds, closedness, and for closed schemas the very
set of properties — are copied by hand from the published schemas (diapod/orbidocs,
``doc/schemas/``, at the versions the seeds refer to). Nothing upstream is read here:
the facts are the test's own. A generated schema that drifts from them fails.

Also here: documents shaped like the published examples decode with the Structs.
"""

from __future__ import annotations

import importlib.resources
import json
from typing import Any

import jsonschema
import msgspec
import pytest

from sensorium.shared.wire.deferred import DeferredOperation, DeferredOperationStatus
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.observation import Observation

SCHEMA_DIR = importlib.resources.files("sensorium.schemas")
DID_KEY = "^did:key:z[1-9A-HJ-NP-Za-km-z]+$"
OPERATION_ID = "^deferred:[a-z][a-z0-9.-]*:[A-Za-z0-9_-]+$"
DOTTED = "^[a-z][a-z0-9-]*(\\.[a-z][a-z0-9-]*)*$"
KIND = "[a-z][a-z0-9-]*(\\.[a-z][a-z0-9-]*)*(/[a-z][a-z0-9-]*(\\.[a-z][a-z0-9-]*)*)*$"
ARTIFACT_ID = "^(sha256:[A-Za-z0-9_-]+|memarium-blob:[A-Za-z0-9._:/-]+)$"

# Each entry: a path to a (sub)schema — property names, "[]" for array items — and
# what the published schema says there. ``closed``: additionalProperties false;
# ``properties``: for a closed schema, exactly the property names it allows.
Facts = dict[str, Any]
PUBLISHED: dict[str, list[tuple[tuple[str, ...], Facts]]] = {
    "sensorium-directive.v1": [
        (
            (),
            {
                "closed": False,
                "required": {
                    "schema",
                    "schema/v",
                    "directive/id",
                    "directive/issued_at",
                    "issuer",
                    "action_id",
                    "parameters",
                    "timing",
                },
                "dependentRequired": {"issuer_delegation": ["signature"]},
            },
        ),
        (("schema",), {"values": ["sensorium-directive.v1"]}),
        (("schema/v",), {"values": [1]}),
        (("action_id",), {"pattern": DOTTED}),
        (("directive/issued_at",), {"format": "date-time"}),
        (("deadline_at",), {"format": "date-time"}),
        (("parameters",), {"closed": False}),
        (
            ("issuer",),
            {
                "closed": False,
                "anyOf": [{"required": ["participant/did:key"]}, {"required": ["module_id"]}],
            },
        ),
        (("issuer", "module_id"), {"minLength": 1}),
        (
            ("issuer", "participant/did:key"),
            {"pattern": "^(participant:)?did:key:z[1-9A-HJ-NP-Za-km-z]+$"},
        ),
        (("issuer", "node_id"), {"pattern": "^node:did:key:z[1-9A-HJ-NP-Za-km-z]+$"}),
        (("timing",), {"closed": False, "required": {"timeout_ms", "mode"}}),
        (("timing", "timeout_ms"), {"minimum": 1}),
        (("timing", "mode"), {"values": ["sync", "async"]}),
        (("evidence/inputs", "[]"), {"closed": False, "required": {"artifact/id", "role"}}),
        (
            ("evidence/inputs", "[]", "artifact/id"),
            {"pattern": "^(sha256:[A-Za-z0-9_-]+|memarium-blob:[A-Za-z0-9._:/-]+)$"},
        ),
        (
            ("evidence/inputs", "[]", "role"),
            {"values": ["stdout", "stderr", "produced-file", "raw-capture"]},
        ),
        (("evidence/inputs", "[]", "size_bytes"), {"minimum": 0}),
        (
            ("issuer_delegation",),
            {
                "closed": False,
                "required": {
                    "delegation_id",
                    "proxy_key",
                    "principal_key",
                    "grants",
                    "expires_at",
                    "principal_signature",
                },
            },
        ),
        (("issuer_delegation", "delegation_id"), {"pattern": "^delegation:key:", "minLength": 1}),
        (("issuer_delegation", "proxy_key"), {"pattern": DID_KEY}),
        (("issuer_delegation", "principal_key"), {"pattern": DID_KEY}),
        (("issuer_delegation", "grants"), {"minProperties": 1}),
        (("issuer_delegation", "max_chain_depth"), {"values": [0]}),
        (("issuer_delegation", "principal_signature"), {"minLength": 1}),
        (("signature",), {"closed": False, "required": {"alg", "value"}}),
        (("signature", "alg"), {"values": ["ed25519"]}),
        (("signature", "value"), {"minLength": 1}),
    ],
    "sensorium-observation.v1": [
        (
            (),
            {
                "closed": False,
                "required": {
                    "schema",
                    "schema/v",
                    "observation/id",
                    "connector/id",
                    "connector/kind",
                    "observed/at",
                    "ingested/at",
                    "signal/kind",
                    "confidence",
                    "freshness",
                    "sensitivity",
                    "source/ref",
                    "admission",
                },
            },
        ),
        (("schema",), {"values": ["sensorium-observation.v1"]}),
        (("schema/v",), {"values": [1]}),
        (("observed/at",), {"format": "date-time"}),
        (("ingested/at",), {"format": "date-time"}),
        (("connector/submitted_at",), {"format": "date-time"}),
        (("signal/kind",), {"pattern": "^" + KIND}),
        (("signal/family",), {"pattern": "^[a-z][a-z0-9-]*(/[a-z0-9-]+)*$"}),
        (("summary",), {"closed": False, "required": {"lang", "text"}}),
        (("confidence",), {"closed": False, "required": {"class"}}),
        (("confidence", "class"), {"values": ["unknown", "low", "medium", "high"]}),
        (("freshness",), {"closed": False, "required": {"ttl_sec"}}),
        (("freshness", "ttl_sec"), {"minimum": 1}),
        (("freshness", "expires_at"), {"format": "date-time"}),
        (("sensitivity",), {"closed": False, "required": {"class"}}),
        (
            ("sensitivity", "class"),
            {
                "values": [
                    "public",
                    "community",
                    "private",
                    "operational-sensitive",
                    "sensitive-personal",
                ]
            },
        ),
        (("source/ref",), {"closed": False, "required": {"kind", "value"}}),
        (("source/ref", "kind"), {"pattern": "^" + KIND}),
        (("source/ref", "value"), {"minLength": 1}),
        (("evidence/refs", "[]"), {"closed": False, "required": {"artifact/id", "role"}}),
        (("evidence/refs", "[]", "artifact/id"), {"pattern": ARTIFACT_ID}),
        (
            ("evidence/refs", "[]", "role"),
            {"values": ["stdout", "stderr", "produced-file", "raw-capture"]},
        ),
        (("evidence/refs", "[]", "size_bytes"), {"minimum": 0}),
        (("policy/hints",), {"closed": False}),
        (
            ("admission",),
            {
                "closed": False,
                "required": {
                    "status",
                    "redaction_status",
                    "memarium_admit",
                    "consumer_scopes",
                    "store",
                    "publish_topics",
                },
            },
        ),
        (("admission", "status"), {"values": ["admitted"]}),
        (("admission", "store"), {"closed": False, "required": {"record/id", "ttl_sec"}}),
        (("admission", "store", "record/id"), {"minLength": 1}),
        (("admission", "store", "ttl_sec"), {"minimum": 1}),
        (("admission", "store", "expires_at"), {"format": "date-time"}),
        (("admission", "publish_topics"), {"minItems": 1}),
        (
            ("admission", "publish_topics", "[]"),
            {"pattern": "^local/sensorium/observations/" + KIND},
        ),
    ],
    "deferred-operation.v1": [
        (
            (),
            {
                "closed": True,
                "required": {
                    "schema",
                    "schema/v",
                    "status",
                    "operation/id",
                    "operation/kind",
                    "created_at",
                    "retry_after_seconds",
                    "expires_at",
                },
                "properties": {
                    "schema",
                    "schema/v",
                    "status",
                    "operation/id",
                    "operation/kind",
                    "created_at",
                    "retry_after_seconds",
                    "expires_at",
                    "status_href",
                    "cancel_href",
                    "cancel/unavailable-reason",
                    "correlation/id",
                    "audit/outcome-ref",
                    "continuation",
                    "diagnostics",
                    "extensions",
                },
                "oneOf": [
                    {
                        "required": ["cancel_href"],
                        "not": {"required": ["cancel/unavailable-reason"]},
                    },
                    {
                        "required": ["cancel/unavailable-reason"],
                        "not": {"required": ["cancel_href"]},
                    },
                ],
            },
        ),
        (("schema",), {"values": ["deferred-operation.v1"]}),
        (("schema/v",), {"values": [1]}),
        (("status",), {"values": ["deferred"]}),
        (("operation/id",), {"pattern": OPERATION_ID}),
        (("operation/kind",), {"pattern": DOTTED}),
        (("created_at",), {"format": "date-time"}),
        (("expires_at",), {"format": "date-time"}),
        (("retry_after_seconds",), {"minimum": 1, "maximum": 3600}),
        (("cancel/unavailable-reason",), {"minLength": 1}),
        (("audit/outcome-ref",), {"minLength": 1}),
        (("continuation",), {"closed": False}),
        (("extensions",), {"closed": False}),
    ],
    "deferred-operation-status.v1": [
        (
            (),
            {
                "closed": True,
                "required": {
                    "schema",
                    "schema/v",
                    "status",
                    "operation/id",
                    "operation/kind",
                    "updated_at",
                },
                "properties": {
                    "schema",
                    "schema/v",
                    "status",
                    "operation/id",
                    "operation/kind",
                    "updated_at",
                    "retry_after_seconds",
                    "expires_at",
                    "result",
                    "diagnostics",
                    "extensions",
                },
                "allOf": [
                    {
                        "if": {
                            "properties": {"status": {"const": "completed"}},
                            "required": ["status"],
                        },
                        "then": {"required": ["result"]},
                    }
                ],
            },
        ),
        (("schema",), {"values": ["deferred-operation-status.v1"]}),
        (("schema/v",), {"values": [1]}),
        (
            ("status",),
            {
                "values": [
                    "pending",
                    "running",
                    "completed",
                    "failed",
                    "timed-out",
                    "cancelled",
                    "expired",
                    "unknown",
                ]
            },
        ),
        (("operation/id",), {"pattern": OPERATION_ID}),
        (("operation/kind",), {"pattern": DOTTED}),
        (("updated_at",), {"format": "date-time"}),
        (("expires_at",), {"format": "date-time"}),
        (("retry_after_seconds",), {"minimum": 1, "maximum": 3600}),
        (("extensions",), {"closed": False}),
    ],
}


def _load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text("utf-8"))
    return doc


def _deref(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with ``$ref`` followed and a nullable ``anyOf`` reduced to its non-null side."""
    while True:
        if "$ref" in node:
            node = doc["$defs"][node["$ref"].removeprefix("#/$defs/")]
            continue
        options = node.get("anyOf")
        if options and any(o.get("type") == "null" for o in options):
            rest = [o for o in options if o.get("type") != "null"]
            if len(rest) == 1:
                node = rest[0]
                continue
        return node


def _at(doc: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = _deref(doc, doc)
    for step in path:
        node = _deref(doc, node["items"] if step == "[]" else node["properties"][step])
    return node


def _values(node: dict[str, Any]) -> list[Any] | None:
    if "const" in node:
        return [node["const"]]
    enum: list[Any] | None = node.get("enum")
    return enum


CASES = [(name, path, facts) for name, rows in PUBLISHED.items() for path, facts in rows]


@pytest.mark.parametrize(
    ("name", "path", "facts"), CASES, ids=[f"{n}:/{'/'.join(p)}" for n, p, _ in CASES]
)
def test_project_schema_states_the_published_facts(
    name: str, path: tuple[str, ...], facts: Facts
) -> None:
    node = _at(_load(name), path)
    for fact, expected in facts.items():
        if fact == "closed":
            assert (node.get("additionalProperties") is False) == expected, (fact, node)
        elif fact == "required":
            assert set(node.get("required", [])) == expected
        elif fact == "properties":
            assert set(node["properties"]) == expected
        elif fact == "values":
            assert sorted(map(str, _values(node) or [])) == sorted(map(str, expected))
        else:
            assert node.get(fact) == expected, (fact, node)


# --- documents shaped like the published examples -----------------------------------------

CANCELABLE = {
    "schema": "deferred-operation.v1",
    "schema/v": 1,
    "status": "deferred",
    "operation/id": "deferred:sensorium.directive.invoke:example-cancelable",
    "operation/kind": "sensorium.directive.invoke",
    "created_at": "2026-05-12T10:00:00Z",
    "retry_after_seconds": 5,
    "expires_at": "2026-05-12T10:15:00Z",
    "status_href": "/v1/deferred-operations/deferred:sensorium.directive.invoke:x/status",
    "cancel_href": "/v1/deferred-operations/deferred:sensorium.directive.invoke:x/cancel",
    "audit/outcome-ref": "outcome:deferred:example-cancelable",
    "continuation": {"owner": "sensorium-core", "resume": "poll-sensorium"},
}
NON_CANCELABLE = {
    "schema": "deferred-operation.v1",
    "schema/v": 1,
    "status": "deferred",
    "operation/id": "deferred:artifact-delivery.submit:example-non-cancelable",
    "operation/kind": "artifact-delivery.submit",
    "created_at": "2026-05-12T10:00:00Z",
    "retry_after_seconds": 10,
    "expires_at": "2026-05-12T10:15:00Z",
    "status_href": "/v1/artifact-delivery/deliveries/delivery:x/operation-status",
    "cancel/unavailable-reason": "dispatch-may-already-be-in-flight",
    "audit/outcome-ref": "outcome:deferred:example-non-cancelable",
}


@pytest.mark.parametrize("doc", [CANCELABLE, NON_CANCELABLE], ids=["cancelable", "non-cancelable"])
def test_published_example_shapes_decode(doc: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(_load("deferred-operation.v1")).validate(doc)
    handle = msgspec.json.decode(json.dumps(doc), type=DeferredOperation)
    again = json.loads(msgspec.json.encode(handle))
    assert {k: v for k, v in again.items() if k in doc} == doc


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update({"cancel/unavailable-reason": "both"}),  # both surfaces
        lambda d: d.pop("cancel_href"),  # neither
        lambda d: d.update({"owner_module_id": "sensorium-os"}),  # closed root
        lambda d: d.update({"retry_after_seconds": 3601}),
    ],
    ids=["ambiguous-cancelability", "missing-cancelability", "unknown-field", "retry-too-long"],
)
def test_published_invalid_shapes_are_refused(mutate: Any) -> None:
    doc = json.loads(json.dumps(CANCELABLE))
    mutate(doc)
    assert not jsonschema.Draft202012Validator(_load("deferred-operation.v1")).is_valid(doc)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(doc), type=DeferredOperation)


def test_completed_status_without_result_is_invalid_and_absent_is_not_null() -> None:
    validator = jsonschema.Draft202012Validator(_load("deferred-operation-status.v1"))
    status = DeferredOperationStatus(
        operation_id="deferred:sensorium.directive.invoke:01J",
        status="completed",
        updated_at="2026-05-12T10:00:00Z",
    )
    doc = json.loads(msgspec.json.encode(status))
    assert "result" not in doc and "retry_after_seconds" not in doc and "expires_at" not in doc
    assert not validator.is_valid(doc)
    doc["result"] = {"schema": "sensorium-directive-result.v1", "status": "completed"}
    validator.validate(doc)


# A directive as proposal 045 shows one: a participant issuer on a node, evidence by
# reference, a delegated signature, and a field this node does not know.
DIRECTIVE_045 = {
    "schema": "sensorium-directive.v1",
    "schema/v": 1,
    "directive/id": "01JTK8Z6S9J3Y2X0V8H7R5M4N1",
    "directive/issued_at": "2026-05-12T10:00:00Z",
    "issuer": {
        "participant/did:key": "participant:did:key:z6MkpTHR8VNsBxYAAWHut2Geadd9jS",
        "module_id": "orbiplex.arca",
        "node_id": "node:did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK",
    },
    "idempotency/key": "arca:run-7:step-2",
    "action_id": "os.process.spawn-read-only",
    "parameters": {"argv_profile": "uptime"},
    "evidence/inputs": [
        {"artifact/id": "sha256:9f86d081884c7d65", "role": "raw-capture", "size_bytes": 12}
    ],
    "timing": {"timeout_ms": 5000, "mode": "sync"},
    "deadline_at": "2026-05-12T10:00:05Z",
    "correlation/id": "arca:run-7",
    "issuer_delegation": {
        "delegation_id": "delegation:key:01JTK8",
        "proxy_key": "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK",
        "principal_key": "did:key:z6MkpTHR8VNsBxYAAWHut2Geadd9jS",
        "grants": {"sensorium.directive.invoke": ["os.process.spawn-read-only"]},
        "expires_at": "2026-06-01T00:00:00Z",
        "max_chain_depth": 0,
        "principal_signature": "c2lnbmF0dXJl",
    },
    "signature": {"alg": "ed25519", "value": "c2lnbmF0dXJl"},
    "causal/context": {"parent": "later upstream field"},
}


def test_a_045_directive_decodes_and_validates() -> None:
    jsonschema.Draft202012Validator(_load("sensorium-directive.v1")).validate(DIRECTIVE_045)
    d = msgspec.json.decode(json.dumps(DIRECTIVE_045), type=Directive)
    assert d.issuer.participant_did_key is not None and d.issuer.module_id == "orbiplex.arca"
    assert d.caller_deadline_at == "2026-05-12T10:00:05Z"
    assert d.signature is not None and d.issuer_delegation is not None
    assert d.evidence_inputs is not None and d.evidence_inputs[0].role == "raw-capture"


# An observation as proposal 045 shows one: a bare community kind, a subject, policy
# hints, Memarium admission, and a field this node does not know.
OBSERVATION_045 = {
    "schema": "sensorium-observation.v1",
    "schema/v": 1,
    "observation/id": "obs:local:01JTK8Z6S9J3Y2X0V8H7R5M4N1",
    "invocation/id": "inv:local:01JTK8",
    "directive/id": "drv_01JGABCD",
    "outcome/id": "dout_01JG",
    "correlation/id": "arca-workflow-run-7-step-3",
    "connector/id": "sensorium.github.releases",
    "connector/kind": "public-network-reader",
    "observed/at": "2026-04-18T10:00:00Z",
    "connector/submitted_at": "2026-04-18T10:00:01Z",
    "ingested/at": "2026-04-18T10:00:02Z",
    "signal/kind": "release",
    "signal/family": "workflow/completed",
    "subject/kind": "github-repository",
    "subject/id": "speakleash/bielik",
    "summary": {"lang": "en", "text": "A new Bielik release candidate was observed."},
    "confidence": {"class": "high", "rationale": "Observed from the release feed."},
    "freshness": {"ttl_sec": 86400},
    "sensitivity": {"class": "public", "redaction": "none"},
    "source/ref": {"kind": "url", "value": "https://github.com/speakleash/bielik/releases"},
    "evidence/refs": [{"artifact/id": "memarium-blob:abc/1", "role": "raw-capture"}],
    "policy/hints": {
        "shareable": False,
        "memarium_admit_hint": True,
        "requested_consumer_scopes": ["monus.read", "arca.read"],
    },
    "admission": {
        "status": "admitted",
        "redaction_status": "not-needed",
        "memarium_admit": True,
        "consumer_scopes": ["monus.read", "arca.read"],
        "store": {"record/id": "module-store:sensorium:obs:local:01J", "ttl_sec": 86400},
        "publish_topics": ["local/sensorium/observations/release"],
    },
    "causal/context": {"parent": "later upstream field"},
}


def test_a_045_observation_decodes_and_validates() -> None:
    jsonschema.Draft202012Validator(_load("sensorium-observation.v1")).validate(OBSERVATION_045)
    obs = msgspec.json.decode(json.dumps(OBSERVATION_045), type=Observation)
    assert obs.signal_kind == "release" and obs.subject_id == "speakleash/bielik"
    assert obs.admission.publish_topics == ["local/sensorium/observations/release"]
    again = json.loads(msgspec.json.encode(obs))
    assert {k: v for k, v in again.items() if k in OBSERVATION_045} == {
        k: v for k, v in OBSERVATION_045.items() if k != "causal/context"
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sensitivity", {"class": "secret"}),
        ("sensitivity", {"class": "operational"}),
        ("signal/kind", "Release"),
        ("signal/family", "vendor.dotted/family"),
        ("evidence/refs", [{"artifact/id": "outcome:01J", "role": "outcome"}]),
        ("summary", {"k": "v"}),
        ("observed_at", None),  # the pre-045 spelling: observed/at is then missing
    ],
)
def test_observations_the_published_schema_refuses_are_refused(field: str, value: Any) -> None:
    doc = json.loads(json.dumps(OBSERVATION_045))
    if field == "observed_at":
        doc["observed_at"] = doc.pop("observed/at")
    else:
        doc[field] = value
    assert not jsonschema.Draft202012Validator(_load("sensorium-observation.v1")).is_valid(doc)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(doc), type=Observation)
