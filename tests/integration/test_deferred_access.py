"""Whose deferred operations, flows and idempotency keys are whose (issue 16, items 5,
9 and 10): a real node with core on tcp under CURVE, three client keys.

- alice and carol are both granted the group ``test``; mallory only ``other``;
- the node's own key (``Stack.client()``, as the local CLI uses it) is the operator.

Status carries a summary by default; the raw outcome (argv with the parameters,
stdout) only for the key that created the operation, or the operator, asking with
``include_result``. Another key's operation is invisible unless its action is
granted, and its raw outcome never. An idempotency key is bound to its caller, its
action and its parameters.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from harness import (
    Stack,
    deferrable_sleep,
    free_port,
    keys_cli,
    python_action,
    start_stack,
    write_dropin,
)

from sensorium.client import Client, GrantDenied, IdempotencyConflict
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.curve import ClientKeys
from sensorium.shared.rpc.curvekeys import CurveStore
from sensorium.shared.wire.deferred import DeferredOperation, DeferredOperationStatus
from sensorium.shared.wire.outcome import Outcome

ACTIONS: list[dict[str, Any]] = [
    deferrable_sleep("test.defer.sleep"),
    python_action(
        "test.echo-args", "echo_args.py", ["--", "{{value}}"], {"value": {"type": "string"}}
    ),
    python_action(
        "other.echo",
        "echo_args.py",
        ["--", "{{value}}"],
        {"value": {"type": "string"}},
        group="other",
    ),
]


@pytest.fixture(scope="module")
def node() -> Iterator[Stack]:
    paths = StatePaths(Path(tempfile.mkdtemp(prefix="st-", dir="/tmp")))
    paths.ensure()
    root = str(paths.root)
    # Grants are checked against the catalog: it is written before the keys.
    write_dropin(paths, "50-tests", ACTIONS)
    keys_cli(root, "curve", "init")
    for name, grant in (("alice", "test"), ("carol", "test"), ("mallory", "other")):
        keys_cli(root, "client", "add", name, "--grant", grant)
    config = {
        "endpoints": {
            "core": f"tcp://127.0.0.1:{free_port()}",
            "connector": f"tcp://127.0.0.1:{free_port()}",
        },
        "deferred": {"min_retry_s": 0.2},
    }
    stack = start_stack(paths, ACTIONS, config)
    try:
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(paths.root, ignore_errors=True)


def _client(node: Stack, name: str) -> Client:
    endpoint = json.loads(node.paths.node_config.read_text())["endpoints"]["core"]
    issued = CurveStore(node.paths).issued_dir / f"{name}.key_secret"
    # Bound to no module, a key may issue as its own name only.
    return Client(endpoint, curve=ClientKeys.load(issued), module_id=name)


def _defer(c: Client, seconds: float, **kw: Any) -> DeferredOperation:
    op = c.invoke("test.defer.sleep", {"seconds": seconds}, mode="async", **kw)
    assert isinstance(op, DeferredOperation)
    return op


def _denials(node: Stack, subject: str) -> list[tuple[str, str]]:
    """(kind, code) of the audit store's records about ``subject`` (an operation id)."""
    with apsw.Connection(str(node.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as db:
        rows = db.execute(
            "SELECT kind, code FROM records WHERE directive_id = ?", (subject,)
        ).fetchall()
    return [(str(k), str(c)) for k, c in rows]


def _eventually_denied(node: Stack, subject: str, at_least: int) -> list[tuple[str, str]]:
    # Refusal records are group-committed moments after the reply: a later write by
    # the same core (this invoke) is committed after them.
    with _client(node, "alice") as alice:
        alice.invoke("test.echo-args", {"value": "flush"})
    found = _denials(node, subject)
    assert len(found) >= at_least, found
    return found


def test_status_is_a_summary_and_the_raw_outcome_is_its_creators(node: Stack) -> None:
    with _client(node, "alice") as alice:
        op = _defer(alice, 0.2345)
        final = alice.wait(op, 30)
        assert final.status == "completed"
        # By default: references and a summary, no argv, parameters or output.
        assert isinstance(final.result, dict)
        assert final.result["outcome/id"] and final.result["exit_code"] == 0
        assert final.result["raw"].startswith("withheld")
        assert not {"argv", "stdout", "stderr"} & set(final.result)
        assert "0.2345" not in json.dumps(final.result) and "woke" not in json.dumps(final.result)
        # Its creator asks for the raw outcome, and gets it.
        raw = alice.status(op, include_result=True).result
        assert "woke" in raw["stdout"]["text"] and "0.2345" in raw["argv"]
        assert raw["outcome/id"] == final.result["outcome/id"]
    with _client(node, "carol") as carol:  # granted the action, but not its creator
        seen = carol.status(op)
        assert seen.status == "completed" and "0.2345" not in json.dumps(seen.result)
        assert op.operation_id in [o.operation_id for o in carol.operations().operations]
        with pytest.raises(GrantDenied) as denied:
            carol.status(op, include_result=True)
        assert denied.value.code == "grant-denied" and "include_result" in denied.value.message
        with pytest.raises(GrantDenied):
            carol.wait(op, 5, include_result=True)
    with node.client() as operator:  # the node's own key: the operator sees everything
        assert "woke" in operator.status(op, include_result=True).result["stdout"]["text"]
    assert ("rejection", "grant-denied") in _eventually_denied(node, op.operation_id, 2)


def test_another_clients_operation_is_neither_listed_nor_read_nor_cancelled(
    node: Stack,
) -> None:
    with _client(node, "alice") as alice:
        done = _defer(alice, 0.2)
        running = _defer(alice, 30.5)
        assert alice.wait(done, 30).status == "completed"
    with _client(node, "mallory") as mallory:  # granted only "other"
        listed = [o.operation_id for o in mallory.operations(limit=1000).operations]
        assert done.operation_id not in listed and running.operation_id not in listed
        for attempt in (
            lambda: mallory.status(done),
            lambda: mallory.status(done, include_result=True),
            lambda: mallory.status(running, refresh=True),
            lambda: mallory.cancel(running),
        ):
            with pytest.raises(GrantDenied) as denied:
                attempt()
            assert denied.value.code == "grant-denied"
    with _client(node, "alice") as alice:
        # Nothing mallory did touched it: alice still cancels her own.
        assert alice.status(running).status in ("pending", "running")
        assert alice.cancel(running).status == "cancelled"
    kinds = _eventually_denied(node, done.operation_id, 2)
    assert set(kinds) == {("rejection", "grant-denied")}
    assert ("rejection", "grant-denied") in _denials(node, running.operation_id)


def test_a_flow_is_read_by_its_starter_and_never_shows_its_context_to_others(
    node: Stack,
) -> None:
    flow = {
        "steps": [
            {
                "step_id": "echo",
                "action_id": "test.echo-args",
                "parameters": {"value": "${secret}"},
                "output_binding": "said",
            }
        ]
    }
    with _client(node, "alice") as alice:
        started = alice.run_flow(flow, {"secret": "alice-flow-secret"})
        assert started.state == "completed"
        mine = alice.flow_status(started.flow_id)
        assert "alice-flow-secret" in json.dumps(mine.context)
    with _client(node, "mallory") as mallory, pytest.raises(GrantDenied):
        mallory.flow_status(started.flow_id)
    with _client(node, "carol") as carol:  # granted every step's action: state only
        theirs = carol.flow_status(started.flow_id)
        assert theirs.state == "completed" and theirs.context == {}
    _eventually_denied(node, started.flow_id, 1)


def test_an_idempotency_key_is_bound_to_its_caller_action_and_parameters(node: Stack) -> None:
    with _client(node, "alice") as alice:
        first = alice.invoke("test.echo-args", {"value": "alice-private"}, idempotency_key="k-1")
        assert isinstance(first, Outcome) and "alice-private" in first.stdout.text
        again = alice.invoke("test.echo-args", {"value": "alice-private"}, idempotency_key="k-1")
        assert isinstance(again, Outcome) and again.outcome_id == first.outcome_id
        with pytest.raises(IdempotencyConflict) as other_params:
            alice.invoke("test.echo-args", {"value": "something else"}, idempotency_key="k-1")
        assert other_params.value.code == "idempotency-conflict"
        assert other_params.value.path == "$.idempotency/key"
        assert "alice-private" not in other_params.value.message
        with pytest.raises(IdempotencyConflict):  # another action under the same key
            alice.invoke("test.defer.sleep", {"seconds": 0.1}, idempotency_key="k-1")
        handle = _defer(alice, 0.2, idempotency_key="k-2")
        assert _defer(alice, 0.2, idempotency_key="k-2").operation_id == handle.operation_id
        with pytest.raises(IdempotencyConflict):
            _defer(alice, 0.3, idempotency_key="k-2")
    with _client(node, "carol") as carol:  # the same key from another client: its own
        hers = carol.invoke("test.echo-args", {"value": "carol's"}, idempotency_key="k-1")
        assert isinstance(hers, Outcome) and hers.outcome_id != first.outcome_id
        assert "carol's" in hers.stdout.text and "alice-private" not in hers.stdout.text
        other = _defer(carol, 0.3, idempotency_key="k-2")
        assert other.operation_id != handle.operation_id
        final: DeferredOperationStatus = carol.wait(other, 30, include_result=True)
        assert final.status == "completed" and "0.3" in final.result["argv"]
    with node.client() as operator:  # the operator's key space is its own too
        mine = operator.invoke("test.echo-args", {"value": "operator"}, idempotency_key="k-1")
        assert isinstance(mine, Outcome) and "alice-private" not in mine.stdout.text
        with pytest.raises(IdempotencyConflict):
            operator.invoke("test.echo-args", {"value": "changed"}, idempotency_key="k-1")
