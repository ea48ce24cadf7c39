"""Idempotency keys are bound to (caller, action, parameters) (issue 16, item 10):
the pure parts, and the audit store's in-place upgrade that holds the binding."""

from __future__ import annotations

import asyncio
from pathlib import Path

import apsw
import pytest

from sensorium.core.audit import VERSION, AuditStore
from sensorium.core.keyspace import MAX_KEY, check_binding, params_digest, scoped, scoped_key
from sensorium.core.records import dispatch_intent
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.directive import Directive, Issuer, new_directive

ALICE = "A" * 40
CAROL = "C" * 40


def _d(params: dict[str, object], key: str | None = "k", action: str = "a.b") -> Directive:
    return new_directive(
        action,
        params,
        issuer=Issuer(module_id="sensorium.tests"),
        idempotency_key=key,
        directive_id="d1",
    )


def test_each_client_has_a_key_space_of_its_own() -> None:
    assert scoped_key(None, "k") == "k"  # the operator's: the key as sent
    assert len({scoped_key(ALICE, "k"), scoped_key(CAROL, "k"), "k"}) == 3
    long = scoped_key(ALICE, "x" * MAX_KEY)
    assert len(long) <= MAX_KEY and long != scoped_key(ALICE, "y" * MAX_KEY)
    assert scoped(_d({}), ALICE).idempotency_key == scoped_key(ALICE, "k")
    assert scoped(_d({}, key=None), ALICE).idempotency_key is None


def test_the_digest_is_of_the_canonical_parameters() -> None:
    assert params_digest(_d({"a": 1, "b": [1, 2]})) == params_digest(_d({"b": [1, 2], "a": 1.0}))
    assert params_digest(_d({"a": 1})) != params_digest(_d({"a": 2}))


def test_a_reuse_with_other_parameters_or_action_is_a_conflict() -> None:
    first = _d({"v": "secret"}, key=scoped_key(ALICE, "k"))
    check_binding(first, "a.b", params_digest(first))
    check_binding(first, "a.b", None)  # bound before digests were kept: the action only
    for other in (_d({"v": "other"}, key=first.idempotency_key), _d({}, action="a.c")):
        with pytest.raises(CodedError) as info:
            check_binding(other, "a.b", params_digest(first))
        assert info.value.code == "idempotency-conflict"
        assert info.value.path == "$.idempotency/key"
        assert "secret" not in info.value.message and ALICE not in info.value.message


def test_a_version_5_audit_store_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite"
    store = AuditStore(db)
    store.close()
    with apsw.Connection(str(db)) as conn:
        # Back to what a version 5 store had: no columns of later versions.
        conn.execute("ALTER TABLE dispatches DROP COLUMN params_digest")
        conn.execute("ALTER TABLE dispatches DROP COLUMN spawn_request_id")
        for column in (
            "cpu_user_ms",
            "cpu_system_ms",
            "peak_memory_bytes",
            "io_read_bytes",
            "io_write_bytes",
            "accounting_source",
        ):
            conn.execute(f"ALTER TABLE records DROP COLUMN {column}")
        conn.execute(
            "INSERT INTO dispatches (directive_id, idempotency_key, action_id, seam_request_id, "
            "core_instance, dispatched_at) VALUES ('old', 'k-old', 'a.b', 's', 'c', "
            "'2999-01-01T00:00:00.000Z')"
        )
        conn.execute("PRAGMA user_version=5")
    store = AuditStore(db)
    try:
        assert store.key_binding("k-old", 0) == ("a.b", None)  # kept, not rebuilt
        d = _d({"v": 1}, key="k-new")
        asyncio.run(store.record(dispatch_intent(d, "s2", "c2")))
        assert store.key_binding("k-new", 0) == ("a.b", params_digest(d))
    finally:
        store.close()
    with apsw.Connection(str(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (VERSION,)
