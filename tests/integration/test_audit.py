"""The published result and outcome, live (issue 24, items 3 and 4).

One node: every kind of answer an invoke gets — completed, failed, timed out, admitted,
and each kind of rejection — is captured off the wire and validated against the
project's ``sensorium-directive-result.v1``; the audit then holds exactly one
``sensorium-directive-outcome.v1`` per directive, found by the receipt the caller was
given (``sensorium.audit.get``, ``sensorium audit show``), and a query's page is bounded
whatever it asks for. The tcp side (who may read the audit) is in test_curve.py.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import apsw
import jsonschema
import msgspec
import pytest
from harness import Stack, deferrable_sleep, python_action, running_stack

from sensorium.client.endpoint import core_endpoint
from sensorium.client.errors import ActionNotEnabled, SensoriumError, UnknownId
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.directive import Directive, Issuer, new_directive
from sensorium.shared.wire.outcome import Outcome

SCHEMAS = importlib.resources.files("sensorium.schemas")
PAGE_MAX = 4
ACTIONS: list[dict[str, Any]] = [
    python_action(
        "test.echo-args", "echo_args.py", ["--", "{{value}}"], {"value": {"type": "string"}}
    ),
    python_action("test.exit", "exit_with.py", ["{{code}}"], {"code": {"type": "integer"}}),
    python_action("test.sleep", "sleep.py", ["{{seconds}}"], {"seconds": {"type": "number"}}),
    deferrable_sleep("test.defer.sleep"),
    deferrable_sleep("test.defer.only", execution_mode_support="async-only"),
]
NODE = {
    "deferred": {"min_retry_s": 0.2},
    "limits": {"audit_page_max": PAGE_MAX, "audit_sweep_s": 0.2},
}
ISSUER = Issuer(module_id="sensorium.tests.audit")
RECEIPT = re.compile(r"receipt outcome:(\S+)")


def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        json.loads((SCHEMAS / f"{name}.schema.json").read_text("utf-8"))
    )


RESULT = _validator("sensorium-directive-result.v1")
OUTCOME = _validator("sensorium-directive-outcome.v1")


@pytest.fixture(scope="module")
def node() -> Iterator[Stack]:
    with running_stack(ACTIONS, node=NODE) as s:
        yield s


def _send(node: Stack, d: Directive, wait_s: float = 30.0) -> dict[str, Any]:
    """The reply document as it came off the wire, validated against the result schema."""
    with SyncRpcClient(core_endpoint(state_dir=str(node.paths.root)), name="core") as rpc:
        doc: dict[str, Any] = rpc.call(Invoke(request_id=new_id(), directive=d), dict, wait_s)
    RESULT.validate(doc)
    assert doc["directive/id"] == d.directive_id and isinstance(doc["observation/ids"], list)
    return doc


def _outcome(node: Stack, ident: str) -> dict[str, Any]:
    """The audit's record for ``ident``, validated against the outcome schema."""
    with node.client() as c:
        rec = json.loads(msgspec.json.encode(c.audit_get(ident)))
    OUTCOME.validate(rec)
    return rec


def _directive(action: str, params: dict[str, Any] | None = None, **kw: Any) -> Directive:
    return new_directive(action, params or {}, issuer=ISSUER, **kw)


def test_completed_failed_and_timed_out_are_results_with_their_outcomes(node: Stack) -> None:
    cases = [
        (_directive("test.echo-args", {"value": "hi"}, correlation_id="trace-a"), "completed"),
        (_directive("test.exit", {"code": 3}), "failed"),
        (_directive("test.sleep", {"seconds": 30}, timeout_ms=300), "timed_out"),
    ]
    for d, status in cases:
        doc = _send(node, d)
        assert doc["status"] == status, doc
        # The execution report rides along, under this node's own prefix.
        report = msgspec.convert(doc["sensorium/outcome"], Outcome)
        assert report.outcome_id == doc["outcome/id"]
        rec = _outcome(node, doc["outcome/id"])
        assert rec["outcome/status"] == status and rec["directive/id"] == d.directive_id
        assert rec["issuer"] == {"module_id": ISSUER.module_id}
        assert rec["connector/kind"] == "OS" and rec["connector/id"]
        assert rec["allowlist/ref"]["hash"] and rec["retry/attempts"] == 1
        assert isinstance(rec["duration_ms"], int)
        assert rec["connector/dispatched_at"] <= rec["connector/responded_at"]
        assert rec["observation/ids"] == doc["observation/ids"]
        decision = {"completed": "admit", "failed": "fail", "timed_out": "timeout"}[status]
        assert rec["policy/decision"]["decision"] == decision
        # Found by directive id too: one record per directive.
        assert _outcome(node, d.directive_id)["outcome/id"] == doc["outcome/id"]
    # Sent again, the same directive still has one record: the latest attempt's.
    again = _send(node, cases[0][0])
    assert again["correlation/id"] == "trace-a"
    assert _outcome(node, cases[0][0].directive_id)["outcome/id"] == again["outcome/id"]


def test_every_kind_of_rejection_is_a_rejected_result_with_a_record(node: Stack) -> None:
    past = "2001-01-01T00:00:00Z"
    key = f"audit-{new_id()}"
    first = _send(node, _directive("test.echo-args", {"value": "a"}, idempotency_key=key))
    assert first["status"] == "completed"
    # Another directive under the key is answered the first's outcome, and still gets a
    # record of its own (nothing ran for it), pointing at the first.
    same = _send(node, _directive("test.echo-args", {"value": "a"}, idempotency_key=key))
    assert same["status"] == "completed" and same["outcome/id"] != first["outcome/id"]
    assert same["sensorium/outcome"]["outcome/id"] == first["outcome/id"]
    twin = _outcome(node, same["outcome/id"])
    assert twin["sensorium/deduplicated-from"] == first["outcome/id"]
    assert twin["retry/attempts"] == 0 and twin["directive/id"] == same["directive/id"]
    cases = {
        "action-not-allowlisted": _directive("test.nope"),
        "parameters-invalid": _directive("test.echo-args", {"value": 1}),
        "execution-mode-unsupported": _directive("test.defer.only", {"seconds": 1}),
        "deadline-exceeded": _directive("test.echo-args", {"value": "a"}, deadline_at=past),
        "idempotency-conflict": _directive("test.echo-args", {"value": "b"}, idempotency_key=key),
    }
    for code, d in cases.items():
        doc = _send(node, d)
        assert doc["status"] == "rejected", (code, doc)
        assert doc["observation/ids"] == [] and doc.get("result") is None
        diag = doc["diagnostics"][0]
        assert diag["code"] == code and diag["kind"] == code and diag["level"] == "error"
        assert isinstance(diag["retryable"], bool) and diag["message"]
        rec = _outcome(node, doc["outcome/id"])
        assert rec["outcome/status"] == "rejected" and rec["retry/attempts"] == 0
        assert rec["policy/decision"]["decision"] == "reject"
        assert rec["directive/id"] == d.directive_id and "connector/dispatched_at" not in rec
    with node.client() as c:
        # The clients still raise the typed exception, naming the record.
        with pytest.raises(SensoriumError) as err:
            c.invoke("test.echo-args", {"value": 2})
        assert err.value.code == "parameters-invalid"
        assert _outcome(node, err.value.detail["outcome/id"])["outcome/status"] == "rejected"
        with pytest.raises(UnknownId):
            c.audit_get("no-such-outcome")


def test_an_async_directive_is_admitted_then_its_record_reaches_the_end(node: Stack) -> None:
    d = _directive("test.defer.sleep", {"seconds": 0.3}, mode="async")
    doc = _send(node, d)
    assert doc["status"] == "admitted" and doc.get("result") is None
    handle = doc["sensorium/deferred"]
    assert handle["audit/outcome-ref"] == f"outcome:{doc['outcome/id']}"
    with node.client() as c:
        final = c.wait(handle["operation/id"], deadline=60)
        assert final.status == "completed"
        rec = _outcome(node, doc["outcome/id"])  # the same record, now final
    assert rec["outcome/status"] == "completed" and rec["outcome/id"] == doc["outcome/id"]
    assert rec["sensorium/operation-id"] == handle["operation/id"]
    assert isinstance(rec["duration_ms"], int) and rec["retry/attempts"] >= 1
    with apsw.Connection(str(node.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as db:
        db.set_busy_timeout(5000)
        rows = db.execute(
            "SELECT count(*) FROM outcomes WHERE directive_id = ?", (d.directive_id,)
        ).fetchall()
    assert rows == [(1,)]


def _stored_status(node: Stack, directive_id: str) -> str | None:
    with apsw.Connection(str(node.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as db:
        db.set_busy_timeout(5000)
        rows = db.execute(
            "SELECT status FROM outcomes WHERE directive_id = ?", (directive_id,)
        ).fetchall()
    return str(rows[0][0]) if rows else None


def test_core_ends_an_admitted_record_by_itself_when_the_operation_ends(node: Stack) -> None:
    d = _directive("test.defer.sleep", {"seconds": 0.2}, mode="async")
    doc = _send(node, d)
    assert _stored_status(node, d.directive_id) == "admitted"
    with node.client() as c:
        assert c.wait(doc["sensorium/deferred"]["operation/id"], deadline=60).status == "completed"
    # Nobody reads the record: the sweep ends it (bounded by a generous deadline).
    deadline = time.monotonic() + 60
    while _stored_status(node, d.directive_id) == "admitted" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _stored_status(node, d.directive_id) == "completed"


def test_every_receipt_the_cli_prints_is_found_by_audit_show(node: Stack) -> None:
    ran = node.cli("invoke", "test.echo-args", "--param", "value=cli")
    refused = node.cli("invoke", "test.echo-args", "--param", "value=1", "--param", "x=2")
    assert ran.returncode == 0 and refused.returncode == 2, refused.stderr
    receipts = RECEIPT.findall(ran.stdout) + RECEIPT.findall(refused.stderr)
    assert len(receipts) == 2, (ran.stdout, refused.stderr)
    for receipt in receipts:
        shown = node.cli("audit", "show", f"outcome:{receipt}", "--json")
        assert shown.returncode == 0, shown.stderr
        rec = json.loads(shown.stdout)
        OUTCOME.validate(rec)
        assert rec["outcome/id"] == receipt
    listed = node.cli("audit", "list", "--status", "rejected", "--limit", "2")
    assert listed.returncode == 0 and "rejected" in listed.stdout, listed.stderr


def test_a_huge_query_returns_a_bounded_page_and_pages_cover_everything(node: Stack) -> None:
    with node.client() as c:
        for i in range(PAGE_MAX + 2):  # more than one page of records, whatever ran before
            with pytest.raises(SensoriumError):
                c.invoke("test.nope", {"i": i})
        page = c.audit_query(limit=10**9)
        assert page.limit == PAGE_MAX and len(page.records) == PAGE_MAX
        assert page.next_cursor is not None
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = c.audit_query(action_id="test.nope", limit=10**6, cursor=cursor)
            assert len(page.records) <= PAGE_MAX
            seen += [r.outcome_id for r in page.records]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert len(seen) == len(set(seen)) >= PAGE_MAX + 2
        # A time range in any offset reads the same.
        since = page.records[-1].recorded_at.replace("Z", "+00:00")
        ranged = c.audit_query(since=since, limit=100)
        assert 0 < len(ranged.records) <= PAGE_MAX
        assert all(r.recorded_at >= page.records[-1].recorded_at for r in ranged.records)
        mine = c.audit_query(issuer=ISSUER.module_id, status="completed", limit=100)
        assert mine.records and all(r.status == "completed" for r in mine.records)
        assert all(r.issuer.module_id == ISSUER.module_id for r in mine.records)


def test_an_unauthorized_catalog_is_a_rejection_too(node: Stack) -> None:
    sidecar = node.paths.signatures / "sensorium-os.sig.json"
    good = sidecar.read_bytes()
    sidecar.write_text("{broken")
    try:
        with node.client() as c, pytest.raises(ActionNotEnabled) as err:
            c.invoke("test.echo-args", {"value": "x"})
    finally:
        sidecar.write_bytes(good)
    assert err.value.code == "action-catalog-unauthorized"
    rec = _outcome(node, err.value.detail["outcome/id"])
    assert rec["outcome/status"] == "rejected"
