"""Per-action accounting, live (issue 18 item 14): an action that uses known amounts of
CPU, memory and I/O gets an outcome whose ``accounting`` is at least those amounts; the
audit store keeps them in its record, and ``sensorium invoke`` shows them on one line.

Lower bounds only, taken from what the program measured of itself, never wall time.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from harness import NODE_UID, Stack, python_action, running_stack

from sensorium.shared.wire.outcome import Accounting

MIB = 1024 * 1024
ROUNDS, ALLOC_MIB, WRITE_BYTES = 200_000, 64, 3 * MIB
BURN = python_action(
    "test.burn",
    "burn.py",
    ["{{rounds}}", "{{mib}}", "{{bytes}}"],
    {"rounds": {"type": "integer"}, "mib": {"type": "integer"}, "bytes": {"type": "integer"}},
)
PARAMS = {"rounds": ROUNDS, "mib": ALLOC_MIB, "bytes": WRITE_BYTES}
USED = re.compile(
    r"^used · cpu [\d.]+ ms \(user [\d.]+ \+ sys [\d.]+\) · peak memory [\d.]+ MiB · "
    r"read [\d.]+ MiB · wrote [\d.]+ MiB",
    re.M,
)


@pytest.fixture(scope="module", params=["root", "ordinary-uid"])
def node(request: pytest.FixtureRequest) -> Iterator[Stack]:
    if request.param == "ordinary-uid" and os.geteuid() != 0:
        pytest.skip("starting a node as another uid needs root")
    user = NODE_UID if request.param == "ordinary-uid" else None
    with running_stack([BURN], user=user) as s:
        yield s


def _check(a: Accounting, me: dict[str, Any]) -> None:
    assert a.source in ("rusage", "cgroup-v2")
    assert a.cpu_user_ms is not None and a.cpu_system_ms is not None
    # The program's own CPU time is part of what its reaper counted.
    assert a.cpu_user_ms + a.cpu_system_ms >= me["cpu_ms"] - 0.01, (a, me)
    assert a.peak_memory_bytes is not None
    assert a.peak_memory_bytes >= max(me["maxrss_bytes"], ALLOC_MIB * MIB), (a, me)
    # Both halves of the file: the child's (reaped by the program) and the program's.
    assert a.io_write_bytes is not None and a.io_write_bytes >= WRITE_BYTES, a
    assert a.io_read_bytes is not None and a.io_read_bytes >= me["read"] >= WRITE_BYTES, a


def test_an_outcome_carries_what_its_action_used_and_the_audit_keeps_it(node: Stack) -> None:
    with node.client() as c:
        out = c.invoke("test.burn", PARAMS, timeout_ms=60_000)
        # The published audit record carries it too, under this node's prefix.
        record = c.audit_get(out.outcome_id)
    assert out.status == "completed", out
    assert record.accounting == out.accounting
    me = json.loads(out.stdout.text)
    assert isinstance(out.accounting, Accounting), out
    _check(out.accounting, me)
    with sqlite3.connect(node.paths.audit_db) as db:
        row = db.execute(
            "SELECT cpu_user_ms, cpu_system_ms, peak_memory_bytes, io_read_bytes, "
            "io_write_bytes, accounting_source FROM records WHERE record_id = ?",
            (out.outcome_id,),
        ).fetchone()
    a = out.accounting
    assert row == (
        a.cpu_user_ms,
        a.cpu_system_ms,
        a.peak_memory_bytes,
        a.io_read_bytes,
        a.io_write_bytes,
        a.source,
    )


def test_sensorium_invoke_shows_it_on_one_line(node: Stack) -> None:
    res = node.cli("invoke", "test.burn", *(f"--param={k}={v}" for k, v in PARAMS.items()))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("completed · exit 0"), res.stdout
    assert USED.match(lines[1]), res.stdout
