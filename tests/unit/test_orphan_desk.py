"""The orphan desk on a real audit store and its writer thread: an event whose owner
appears later is recovered, one that never gets an owner is quarantined after the
TTL with a receipt that matches its published schema, and the queue is bounded."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from sensorium.core.audit import AuditStore, Dispatch
from sensorium.core.orphans import OrphanDesk
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import OrphanConfig
from sensorium.shared.ids import new_id
from sensorium.shared.wire.envelope import Reply, WireError
from sensorium.shared.wire.outcome import Outcome

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(tmp_path / "audit.sqlite")
    yield store
    store.close()


def _desk(audit: AuditStore, **cfg: Any) -> OrphanDesk:
    return OrphanDesk(
        audit,
        OrphanConfig(**cfg),
        lambda op: op == "op-known",
        idempotency_window_s=86_400,
    )


def _late_outcome(directive_id: str) -> Reply:
    outcome = Outcome(
        outcome_id=new_id(),
        directive_id=directive_id,
        action_id="test.sleep",
        status="completed",
        exit_code=0,
        started_at=rfc3339(),
        duration_ms=12.0,
        timeout_ms=1000,
    )
    return Reply(request_id=new_id(), ok=True, result=msgspec.Raw(msgspec.msgpack.encode(outcome)))


def _rows(audit: AuditStore) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in audit.read("SELECT kind, state, attached_to, receipt FROM orphans ORDER BY rowid")
    ]


def _settle(audit: AuditStore, desk: OrphanDesk | None = None) -> None:
    async def main() -> None:
        await audit.record(lambda _c: None)  # everything queued before is written
        if desk is not None:
            await audit.record(desk.reconcile)

    asyncio.run(main())


def test_an_outcome_whose_dispatch_lands_later_is_recovered_and_answers_its_key(
    audit: AuditStore,
) -> None:
    desk = _desk(audit)
    directive = new_id()
    desk.receive(_late_outcome(directive))
    _settle(audit)
    assert [r[:2] for r in _rows(audit)] == [("outcome", "queued")]
    audit.enqueue(
        Dispatch(
            directive_id=directive,
            idempotency_key="k-late",
            action_id="test.sleep",
            correlation_id=None,
            seam_request_id=new_id(),
            core_instance="earlier",
            dispatched_at=rfc3339(),
        )
    )
    _settle(audit, desk)
    ((kind, state, attached, receipt),) = _rows(audit)
    assert (kind, state, receipt) == ("outcome", "recovered", None)
    stored = audit.outcome_for_key("k-late", time.time() - 60)
    assert stored is not None and attached == f"outcome:{stored.outcome_id}"
    assert audit.prior_dispatch("k-late", time.time() - 60) is None  # settled by it


def test_an_event_nobody_claims_is_quarantined_with_a_schema_valid_receipt(
    audit: AuditStore,
) -> None:
    desk = _desk(audit, ttl_s=0.2)
    desk.receive(_late_outcome(new_id()))
    desk.receive(
        Reply(request_id="seam-1", ok=False, error=WireError(code="overloaded", message="x"))
    )
    _settle(audit, desk)
    assert {r[1] for r in _rows(audit)} == {"queued"}
    time.sleep(0.3)
    _settle(audit, desk)
    rows = _rows(audit)
    assert {(r[0], r[1]) for r in rows} == {("outcome", "quarantined"), ("error", "quarantined")}
    schema = json.loads((SCHEMAS / "sensorium-orphan-event-receipt.v1.schema.json").read_text())
    for *_rest, receipt in rows:
        doc = json.loads(receipt)
        jsonschema.validate(doc, schema)
        assert doc["type"] == "OrphanEventReceipt"
        assert doc["reason"] == "no-owner-within-ttl"
        assert doc["evidenceRefs"][0].startswith("urn:sensorium:orphan-event:")
        assert "#sha256:" in doc["evidenceRefs"][0]


def test_a_job_update_for_a_known_operation_attaches_and_a_report_is_no_event(
    audit: AuditStore,
) -> None:
    desk = _desk(audit)
    body = msgspec.msgpack.encode({"operation/id": "op-known", "status": "running"})
    desk.receive(Reply(request_id=new_id(), ok=True, result=msgspec.Raw(body)))
    report = msgspec.msgpack.encode({"module_id": "sensorium-os"})
    desk.receive(Reply(request_id=new_id(), ok=True, result=msgspec.Raw(report)))
    _settle(audit)
    assert [r[:3] for r in _rows(audit)] == [("job-update", "recovered", "operation:op-known")]


def test_past_the_queue_bound_an_orphan_is_quarantined_at_once(audit: AuditStore) -> None:
    desk = _desk(audit, max_queued=2)
    for _ in range(3):
        desk.receive(_late_outcome(new_id()))
    _settle(audit)
    states = [r[1] for r in _rows(audit)]
    assert states == ["queued", "queued", "quarantined"]
    receipt = json.loads(next(r for r in _rows(audit) if r[1] == "quarantined")[3])
    assert receipt["reason"] == "queue-full"


def _dispatch(directive: str, seam: str, correlation: str | None = None) -> Dispatch:
    return Dispatch(
        directive_id=directive,
        idempotency_key=None,
        action_id="test.sleep",
        correlation_id=correlation,
        seam_request_id=seam,
        core_instance="earlier",
        dispatched_at=rfc3339(),
    )


def test_an_event_whose_keys_name_two_owners_is_quarantined_not_filed_by_guess(
    audit: AuditStore,
) -> None:
    """Seed 003: ambiguous ownership fails validation. Its directive/id names one
    dispatched directive and its seam request/id another: neither is chosen."""
    desk = _desk(audit)
    first, second = new_id(), new_id()
    audit.enqueue(_dispatch(first, "seam-first"))
    audit.enqueue(_dispatch(second, "seam-second"))
    _settle(audit)
    outcome = Outcome(
        outcome_id=new_id(),
        directive_id=first,
        action_id="test.sleep",
        status="completed",
        exit_code=0,
        started_at=rfc3339(),
        duration_ms=1.0,
        timeout_ms=1000,
    )
    body = msgspec.Raw(msgspec.msgpack.encode(outcome))
    desk.receive(Reply(request_id="seam-second", ok=True, result=body))
    _settle(audit)
    ((kind, state, attached, receipt),) = _rows(audit)
    assert (kind, state, attached) == ("outcome", "quarantined", None)
    assert json.loads(receipt)["reason"] == "ambiguous-owner"
    # Neither directive got the outcome.
    assert not audit.read("SELECT 1 FROM records WHERE kind = 'outcome'")


def test_a_correlation_shared_by_several_directives_does_not_pick_one(
    audit: AuditStore,
) -> None:
    desk = _desk(audit)
    for seam in ("s-1", "s-2"):
        audit.enqueue(_dispatch(new_id(), seam, correlation="workflow-7"))
    _settle(audit)
    body = msgspec.msgpack.encode(
        {"operation/id": "op-unknown", "correlation/id": "workflow-7", "status": "running"}
    )
    desk.receive(Reply(request_id="unknown-seam", ok=True, result=msgspec.Raw(body)))
    _settle(audit)
    rows = _rows(audit)
    assert [(r[1], json.loads(r[3])["reason"]) for r in rows] == [
        ("quarantined", "ambiguous-owner")
    ], rows
