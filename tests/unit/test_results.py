"""The result a caller is answered and the outcome record the audit keeps, as core's
builders make them (``core/outcomes.py``), validate against the project's schemas;
the client reads a result back into the report, the handle or the typed exception."""

from __future__ import annotations

import importlib.resources
import json
from typing import Any

import jsonschema
import msgspec
import pytest

from sensorium.client.errors import ExecutionModeUnsupported, ParametersInvalid
from sensorium.client.results import unwrap
from sensorium.core import outcomes
from sensorium.core.outcomes import Dispatched
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.audit import AllowlistRef, AuditPage, OutcomeRecord
from sensorium.shared.wire.deferred import DeferredOperation
from sensorium.shared.wire.directive import Issuer, new_directive
from sensorium.shared.wire.outcome import Diagnostic, EvidenceRef, Outcome, ResultBody
from sensorium.shared.wire.result import DirectiveResult

SCHEMAS = importlib.resources.files("sensorium.schemas")
DIRECTIVE = new_directive(
    "test.json",
    {"text": "{}"},
    issuer=Issuer(module_id="sensorium.tests"),
    correlation_id="trace-1",
)
AT = Dispatched(
    connector_id="sensorium-os",
    allowlist=AllowlistRef(hash="ab" * 32, signer={"node_id": "node:x", "key/id": "k1"}),
    dispatched_at="2026-05-05T18:00:00.000Z",
    responded_at="2026-05-05T18:00:00.050Z",
)


def _validate(name: str, doc: Any) -> dict[str, Any]:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text("utf-8"))
    body: dict[str, Any] = json.loads(msgspec.json.encode(doc))
    jsonschema.Draft202012Validator(schema).validate(body)
    return body


def _outcome(status: str, **extra: Any) -> Outcome:
    return Outcome(
        outcome_id="01JC7Z4D1R3CTV3M0000000009",
        directive_id=DIRECTIVE.directive_id,
        action_id=DIRECTIVE.action_id,
        status=status,  # type: ignore[arg-type]
        started_at="2026-05-05T18:00:00.010Z",
        duration_ms=12.6,
        timeout_ms=5000,
        **extra,
    )


@pytest.mark.parametrize("status", ["completed", "failed", "timed-out"])
def test_an_execution_becomes_a_published_record_and_result(status: str) -> None:
    ran = _outcome(
        status,
        exit_code=0 if status == "completed" else 3,
        result=ResultBody(json={"a": 1}),
        artifact_refs=[EvidenceRef(id="sha256:abc", role="stdout", size=3)],
        diagnostics=[Diagnostic(code="action-timeout", message="ran past 5000 ms")]
        if status == "timed-out"
        else [],
    )
    rec = outcomes.executed(DIRECTIVE, ran, ["obs-1"], AT)
    doc = _validate("sensorium-directive-outcome.v1", rec)
    assert doc["outcome/status"] == status.replace("-", "_")
    assert isinstance(doc["duration_ms"], int) and doc["observation/ids"] == ["obs-1"]
    assert doc["allowlist/ref"]["hash"] == "ab" * 32 and doc["connector/kind"] == "OS"
    res = outcomes.result(rec, ran)
    body = _validate("sensorium-directive-result.v1", res)
    assert body["outcome/id"] == ran.outcome_id and body["correlation/id"] == "trace-1"
    assert body["result"] == {"a": 1}
    assert body["sensorium/outcome"]["exit_code"] == ran.exit_code
    assert unwrap(body) == ran  # the client hands back the execution report


@pytest.mark.parametrize(
    ("exc", "raised"),
    [
        (
            CodedError(OsErrorCode.PARAMETERS_INVALID, "no", path="$.parameters.x"),
            ParametersInvalid,
        ),
        (
            CodedError(RuntimeErrorCode.EXECUTION_MODE_UNSUPPORTED, "sync-only"),
            ExecutionModeUnsupported,
        ),
    ],
)
def test_a_rejection_is_a_result_and_a_record_and_raises_its_type(
    exc: CodedError, raised: type[Exception]
) -> None:
    rec = outcomes.refused(DIRECTIVE, exc, "01JREJECTED")
    doc = _validate("sensorium-directive-outcome.v1", rec)
    assert doc["outcome/status"] == "rejected" and doc["retry/attempts"] == 0
    assert doc["policy/decision"]["decision"] == "reject" and "connector/id" not in doc
    res = outcomes.rejected_result(DIRECTIVE, exc, "01JREJECTED")
    body = _validate("sensorium-directive-result.v1", res)
    assert body["observation/ids"] == [] and "result" not in body
    diag = body["diagnostics"][0]
    assert {diag["level"], diag["kind"], diag["code"]} == {"error", exc.code}
    assert diag["retryable"] is False
    with pytest.raises(raised) as err:
        unwrap(body)
    assert err.value.code == exc.code and err.value.detail["outcome/id"] == "01JREJECTED"


def test_an_admitted_record_ends_with_its_operation() -> None:
    handle = DeferredOperation(
        operation_id="deferred:sensorium.directive.invoke:01J",
        operation_kind="sensorium.directive.invoke",
        created_at="2026-05-05T18:00:00Z",
        retry_after_seconds=2,
        expires_at="2026-05-05T19:00:00Z",
        cancel_href="/cancel",
    )
    rec = outcomes.admitted(DIRECTIVE, handle, "01JADMITTED", AT)
    _validate("sensorium-directive-outcome.v1", rec)
    body = _validate("sensorium-directive-result.v1", outcomes.result(rec, deferred=handle))
    assert body["status"] == "admitted" and "result" not in body
    assert unwrap(body) == handle


def test_a_result_contradicting_its_status_is_refused_by_both() -> None:
    doc = {
        "schema": "sensorium-directive-result.v1",
        "schema/v": 1,
        "directive/id": "d",
        "status": "rejected",
        "outcome/id": "o",
        "observation/ids": [],
        "result": {"a": 1},
    }
    schema = json.loads((SCHEMAS / "sensorium-directive-result.v1.schema.json").read_text())
    assert not jsonschema.Draft202012Validator(schema).is_valid(doc)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(doc, DirectiveResult)


def test_an_audit_page_validates() -> None:
    rec = outcomes.refused(DIRECTIVE, CodedError("grant-denied", "no"), "01J")
    page = AuditPage(records=[rec], next_cursor="abc", limit=1)
    body = _validate("sensorium-audit-page.v1", page)
    assert msgspec.convert(body, AuditPage).records[0] == msgspec.convert(
        json.loads(msgspec.json.encode(rec)), OutcomeRecord
    )


def test_a_large_structured_result_is_not_repeated_beside_the_report() -> None:
    big = {"rows": ["x" * 100] * (outcomes.RESULT_INLINE_MAX // 100 + 1)}
    ran = _outcome("completed", exit_code=0, result=ResultBody(json=big))
    body = _validate(
        "sensorium-directive-result.v1",
        outcomes.result(outcomes.executed(DIRECTIVE, ran, [], AT), ran),
    )
    assert "result" not in body and body["sensorium/outcome"]["result"]["json"] == big
    assert body["diagnostics"][-1]["code"] == "result-not-inlined"
    assert body["diagnostics"][-1]["level"] == "info"
