"""A full disk and a read-only state directory, on a real file system: a small tmpfs
mounted as the state directory, filled with a ballast file or remounted read-only.

What must hold: a clear `storage-unavailable` instead of a traceback or a crash loop,
no torn or half-written state, and service again as soon as the space is back.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
import structlog
from harness import (
    PROGRAMS,
    SENSORIUM,
    TEST_ACTIONS,
    Stack,
    deferrable_sleep,
    python_action,
    sign_catalog,
    start_stack,
    write_dropin,
)

from sensorium.client import StorageUnavailable
from sensorium.connectors.os.effects import artifacts
from sensorium.connectors.os.jobs.store import JobStore, NewJob
from sensorium.shared import logs
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.registry import Registry, Reservation
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePaths
from sensorium.shared.store import immediate, open_store, storage_error

SIZE = "48m"
# While the disk is full no answer may take long: a process that hangs counts as broken.
FULL_REPLY_S = 10.0
STORAGE_UNAVAILABLE = "storage-unavailable"
NODE = {"deferred": {"min_retry_s": 0.2}}
STORES = ("storage/audit.sqlite", "storage/deferred-operations.sqlite", "connectors/os/jobs.sqlite")

if os.geteuid() != 0:
    pytest.skip("mounting a tmpfs as the state directory needs root", allow_module_level=True)


def _produce_action() -> dict[str, Any]:
    """C5: writes 512 KiB of zeros as its one artifact (random bytes sniff as some other
    media type about once in 60 tries, which would make the verdict a dice roll)."""
    script = PROGRAMS / "storage_produce.py"
    script.write_text("import os\nopen('/tmp/artifacts/blob.bin', 'wb').write(bytes(512 * 1024))\n")
    script.chmod(0o755)
    decl = python_action("sf.produce", script.name)
    decl["parameters_schema"] = {"type": "object", "additionalProperties": False}
    decl["class"] = "artifact-producing-spawn"
    decl["artifact"] = {
        "max_count": 2,
        "max_bytes_per": 1 << 20,
        "max_bytes_total": 1 << 20,
        "allowed_media_types": ["application/octet-stream"],
    }
    return decl


ACTIONS = [*TEST_ACTIONS, deferrable_sleep("sf.defer"), _produce_action()]


@pytest.fixture
def mount() -> Iterator[StatePaths]:
    """A fresh tmpfs of SIZE as the state directory, unmounted whatever happens."""
    root = Path(tempfile.mkdtemp(prefix="sf-", dir="/tmp"))
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        root.rmdir()
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a tmpfs as root: {res.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield StatePaths(root)
    finally:
        if subprocess.run(["umount", str(root)], capture_output=True).returncode != 0:
            # Something of ours still holds it (a straggler): detach it anyway.
            subprocess.run(["umount", "-l", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def stack_on(paths: StatePaths) -> Iterator[Stack]:
    s = start_stack(paths, ACTIONS, NODE)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def _remount(paths: StatePaths, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(paths.root)], check=True)


def fill(paths: StatePaths) -> Path:
    """Take every free block of the state directory's file system with one file."""
    ballast = paths.root / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while (st := os.statvfs(paths.root)).f_bavail:
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, st.f_bavail * st.f_frsize)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                # Someone took a page meanwhile; the next round asks for what is left.
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:
        probe = paths.root / "probe"
        try:
            probe.write_bytes(os.urandom(8192))
        finally:
            probe.unlink(missing_ok=True)
    assert full.value.errno == errno.ENOSPC
    return ballast


def _integrity(paths: StatePaths) -> dict[str, str]:
    out = {}
    for rel in STORES:
        conn = apsw.Connection(str(paths.root / rel), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            out[rel] = str(conn.execute("PRAGMA integrity_check").fetchall()[0][0])
        finally:
            conn.close()
    return out


def _lane_files(paths: StatePaths) -> list[str]:
    lane = paths.artifacts.parent
    return sorted(str(p.relative_to(lane)) for p in lane.rglob("*") if not p.is_dir())


def _log_events(paths: StatePaths) -> tuple[list[dict[str, Any]], list[str]]:
    """Every log line of every process, and the lines that are not whole JSON objects."""
    events, torn = [], []
    for f in sorted(paths.logs.glob("*.jsonl")):
        for line in f.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                torn.append(f"{f.name}: {line[:120]}")
    return events, torn


def _restarts(stack: Stack) -> dict[str, tuple[int | None, int, str]]:
    return {c.name: (c.pid, c.restarts, c.state) for c in stack.status().children}


# -- (a) a read-only state directory --------------------------------------------------


def test_up_on_a_read_only_state_dir_fails_fast_and_says_why(mount: StatePaths) -> None:
    paths = mount
    paths.ensure()
    write_dropin(paths, "50-tests", ACTIONS)
    sign_catalog(paths)
    _remount(paths, "ro")
    t0 = time.monotonic()
    res = subprocess.run(
        [*SENSORIUM, "up", "--quiet", "--state-dir", str(paths.root)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode != 0
    assert time.monotonic() - t0 < 10
    assert STORAGE_UNAVAILABLE in res.stderr and str(paths.root) in res.stderr, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    # Each process alone (as under its own systemd unit) says the same.
    for module in ("sensorium.core", "sensorium.connectors.os", "sensorium.poller"):
        one = subprocess.run(
            [sys.executable, "-m", module, "--state-dir", str(paths.root)],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        assert one.returncode != 0, module
        assert STORAGE_UNAVAILABLE in one.stderr, (module, one.stderr)
        assert "Traceback" not in one.stderr, (module, one.stderr)
    # Writable again: the same state directory starts and serves, nothing was harmed.
    _remount(paths, "rw")
    with stack_on(paths) as stack, stack.client() as c:
        assert c.invoke("test.echo-args", {"value": "back"}).status == "completed"


# -- (b), (c), (d) the disk fills while the stack runs ---------------------------------


def test_a_full_disk_gives_coded_errors_and_service_resumes_when_space_is_freed(
    mount: StatePaths,
) -> None:
    with stack_on(mount) as stack, stack.client() as c:
        paths = stack.paths
        assert c.invoke("test.echo-args", {"value": "warm"}).status == "completed"
        # Running across the full spell: its end must be recorded once space is back.
        across = c.invoke("sf.defer", {"seconds": 1.5}, mode="async")
        before = _restarts(stack)
        ballast = fill(paths)
        full_since = time.monotonic()

        # (b) a sync directive: core cannot audit its outcome, so it is not answered as done.
        with pytest.raises(StorageUnavailable) as sync:
            c.invoke("test.echo-args", {"value": "full"}, reply_timeout_s=FULL_REPLY_S)
        assert str(paths.root) in sync.value.message
        # An async directive: the registry cannot reserve the operation.
        with pytest.raises(StorageUnavailable):
            c.invoke("sf.defer", {"seconds": 0.1}, mode="async", reply_timeout_s=FULL_REPLY_S)
        # (d) an artifact that cannot be written: refused, coded, nothing half-written.
        with pytest.raises(StorageUnavailable):
            c.invoke("sf.produce", {}, reply_timeout_s=FULL_REPLY_S)
        assert _lane_files(paths) == [], "a partial artifact was left in the lane"
        # Reads still answer; many more log lines than fit are thrown at every process.
        for _ in range(20):
            assert c.health().connector is not None
            assert c.operations().operations
            with pytest.raises(StorageUnavailable):
                c.invoke("test.echo-args", {"value": "x" * 2000}, reply_timeout_s=FULL_REPLY_S)
        # Long enough for the deferred job to end and its end to fail to be recorded.
        time.sleep(max(0.0, 3.0 - (time.monotonic() - full_since)))
        assert _restarts(stack) == before, "a process died on the full disk"

        # (c) space is back: the same processes serve again.
        ballast.unlink()
        deadline = time.monotonic() + 10
        while True:
            try:
                out = c.invoke("test.echo-args", {"value": "again"})
                break
            except StorageUnavailable:
                assert time.monotonic() < deadline, "still storage-unavailable with space back"
                time.sleep(0.2)
        assert out.status == "completed"
        assert c.wait(across, 20).status == "completed"
        later = c.invoke("sf.defer", {"seconds": 0.1}, mode="async")
        assert c.wait(later, 20).status == "completed"
        made = c.invoke("sf.produce", {})
        assert made.status == "completed", made.diagnostics
        [ref] = made.artifact_refs
        digest = ref.id.removeprefix("sha256:")
        blob = (paths.artifacts / digest[:2] / digest).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == digest and len(blob) == 512 * 1024
        assert _lane_files(paths) == [f"sha256/{digest[:2]}/{digest}"]
        assert _restarts(stack) == before, "a process was restarted to recover"
        assert _integrity(paths) == dict.fromkeys(STORES, "ok")
        events, torn = _log_events(paths)
        assert not torn, torn
        dropped = [e for e in events if e.get("event") == "log.dropped"]
        assert dropped and all(e["dropped"] > 0 for e in dropped), "no process noted lost lines"


# -- the pieces alone, on the same real full file system ------------------------------


def _coded(exc: BaseException) -> str:
    assert isinstance(exc, CodedError), repr(exc)
    return exc.code


def test_registry_and_job_store_refuse_with_a_code_and_recover(mount: StatePaths) -> None:
    paths = mount
    policy = DeferredHostPolicy(
        min_retry_s=1.0, max_retry_s=60.0, max_ttl_s=900.0, max_attempts=5, jitter=0.2
    )
    registry = Registry(paths.registry_db, policy)
    jobs = JobStore(paths.connector_jobs_db)
    try:

        def reserve(i: int) -> None:
            r = Reservation(
                operation_id=f"deferred:sensorium.directive.invoke:{i}",
                operation_kind="sensorium.directive.invoke",
                owner_module_id="sensorium-os",
                capability_id="sensorium.directive.invoke",
                directive_id=f"d{i}",
                action_id="a",
                correlation_id=None,
                idempotency_key=f"k{i}",
                deadline_at=None,
                preferred_ttl_s=None,
                preferred_retry_s=None,
                cancel_unavailable_reason=None,
                audit_outcome_ref=None,
                confirm_within_s=15.0,
            )
            registry.reserve(r, time.time())

        def submit(i: int) -> None:
            new = NewJob(f"op{i}", "a", f"d{i}", os.urandom(64 << 10), 1000, "h", "me")
            jobs.submit(new, time.time(), 100)

        reserve(0)
        submit(0)
        ballast = fill(paths)
        with pytest.raises(CodedError) as reg:
            reserve(1)
        with pytest.raises(CodedError) as job:
            submit(1)
        assert _coded(reg.value) == _coded(job.value) == STORAGE_UNAVAILABLE
        assert str(paths.registry_db) in reg.value.message
        ballast.unlink()
        reserve(2)
        submit(2)
        assert registry.by_idempotency_key("k1") is None and registry.by_idempotency_key("k2")
        assert jobs.get("op1") is None and jobs.get("op2") is not None
    finally:
        registry.close()
        jobs.close()
    assert _integrity_of(paths.registry_db) == _integrity_of(paths.connector_jobs_db) == "ok"


def test_a_transaction_sqlite_rolled_back_itself_still_maps_to_the_code(
    mount: StatePaths,
) -> None:
    """Past the page cache a full disk fails mid-transaction; SQLite then rolls back on
    its own and the ROLLBACK that follows fails: that is still the full disk."""
    db = mount.root / "big.sqlite"
    conn = open_store(db, schema="CREATE TABLE t (x BLOB);", version=1)
    conn.execute("PRAGMA cache_size=-64")
    ballast = fill(mount)
    ballast.unlink()
    st = os.statvfs(mount.root)
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize - (1 << 20))
    os.close(fd)
    # immediate() itself now answers with the code; storage_error passes it through.
    with pytest.raises(CodedError) as exc, immediate(conn):
        for _ in range(30):
            conn.execute("INSERT INTO t VALUES (?)", (os.urandom(100_000),))
    coded = storage_error(exc.value, db)
    assert coded is not None and coded.code == STORAGE_UNAVAILABLE, repr(exc.value)
    ballast.unlink()
    with immediate(conn):
        conn.execute("INSERT INTO t VALUES (x'00')")
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(1,)]
    conn.close()
    assert _integrity_of(db) == "ok"


def test_an_artifact_the_lane_cannot_take_leaves_nothing_behind(
    mount: StatePaths, tmp_path: Path
) -> None:
    lane = mount.artifacts.parent
    lane.mkdir(parents=True)
    # Zeros, not noise: noise sniffs as a disallowed type ~1.6% of the time, a refusal
    # that publishes nothing and so never reaches the full disk this test is about.
    (tmp_path / "blob.bin").write_bytes(bytes(256 << 10))
    fill(mount)
    with pytest.raises(CodedError) as exc:
        artifacts.promote(
            tmp_path,
            lane=lane,
            max_count=1,
            max_bytes_per=1 << 20,
            max_bytes_total=1 << 20,
            allowed_media_types=["application/octet-stream"],
        )
    assert exc.value.code == STORAGE_UNAVAILABLE and str(lane) in exc.value.message
    assert _lane_files(mount) == []


def test_log_lines_a_full_disk_cannot_take_are_counted_never_torn(mount: StatePaths) -> None:
    path = mount.root / "p.jsonl"
    sink = logs._LineSink(path, console=False)
    ballast = fill(mount)
    lost = 0
    for i in range(64):  # some fit in the file's last page, then one is cut, then none
        with contextlib.suppress(structlog.DropEvent):
            sink(None, "info", {"ts": "t", "process": "p", "event": "e", "n": i, "pad": "x" * 300})
        lost = sink.dropped
    assert lost > 0
    assert all(json.loads(line)["event"] == "e" for line in path.read_text().splitlines())
    ballast.unlink()
    with contextlib.suppress(structlog.DropEvent):
        sink(None, "info", {"ts": "t", "process": "p", "event": "back"})
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in events[-2:]] == ["log.dropped", "back"]
    assert events[-2]["dropped"] == lost and sink.dropped == 0


def _integrity_of(db: Path) -> str:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchall()[0][0])
    finally:
        conn.close()
