"""The audit store's queue bound (core/audit.py): a write no answer waits for is
dropped when the queue is full, counted; one whose receipt went out already is not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sensorium.core import audit
from sensorium.core.audit import AuditRecord, AuditStore


def _record(rid: str) -> AuditRecord:
    return AuditRecord(
        record_id=rid,
        kind="rejection",
        directive_id=f"d-{rid}",
        action_id="no.such",
        status="rejected",
        code="action-not-allowlisted",
        request_id=f"q-{rid}",
        recorded_at="2026-11-26T00:00:00Z",
        body=b"{}",
    )


def test_a_full_queue_drops_a_write_but_not_one_whose_receipt_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "MAX_QUEUED", 0)  # full from the start
    store = AuditStore(tmp_path / "audit.sqlite")
    try:
        assert store.full
        assert not store.enqueue(_record("dropped"))
        assert store.dropped == 1
        assert store.enqueue(_record("given"), past_full=True)
        asyncio.run(store.settled())  # a read after waits for it
        ids = {r[0] for r in store.read("SELECT record_id FROM records")}
        assert ids == {"given"}
    finally:
        store.close()
