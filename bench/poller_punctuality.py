"""Punctuality and cost of the DeferredOperationPoller holding 1,000 pending operations.

A real ``sensorium-core`` and a real ``sensorium-poller`` (``python -m sensorium.<x>
--state-dir DIR``) run against a small stub connector: this script re-run with
``--stub-connector DIR``, a plain pyzmq ROUTER on the connector endpoint that decodes
each ``SeamRequestUnion`` with msgspec and answers in a ``Reply`` envelope — every
``ConnectorStatus`` with ``DeferredOperationStatus(status="running",
retry_after_seconds=1)``, ``ConnectorReport`` with a minimal ``ModuleReport`` (one
``either`` action, so core is ready), ``ConnectorCancel`` with ``cancelled``. Its cost
is the floor of a connector, so what is measured is the poller, core and the registry.

Once core reports the connector, 1,000 operations are admitted straight into the host
registry (``reserve`` + ``confirm`` with an acknowledgement of
``retry_after_seconds=1``; ``deferred.min_retry_s`` = 1 in ``config/node.json``, the
default jitter 0.2), so each is due every 1–1.2 s after its last answer. For 60 s the
poller polls them all through core (``sensorium.operation.status`` with ``refresh``).

Reported, from the poller's own ``poller.stats`` lines in ``logs/poller.jsonl`` (one
every 10 s; the first, which includes the start, is left out): the fraction of polls
started within 250 ms of their due time and the p50/p99 lateness; polls per second
from the registry's attempt counters over the window; CPU of the poller, core and the
stub (psutil ``cpu_times``, user+system, as % of one core) over the same window.

Peer: the ideal poller — every operation polled exactly when due — makes
1000 / (1 s · (1 + 0.2/2)) ≈ 909 polls/s and is 100 % within 250 ms. It is an
arithmetic bound, not a measured program.
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw
import psutil
from _harness import PYTHON, BenchError, Runtime, emit, machine, parse_args, row, stop, wait_ready

from sensorium.shared.config import DeferredConfig

BENCH = "poller punctuality"
N_OPS = 1000
RETRY_S = 1
JITTER = 0.2
DURATION_S = 60.0
STATS_INTERVAL_S = 10.0
READY_TIMEOUT_S = 20.0
ACTION_ID = "bench.deferred"
MODULE_ID = "sensorium-os"
# ``deferred`` in config/node.json; everything else is the default.
NODE_DEFERRED: dict[str, Any] = {"min_retry_s": float(RETRY_S), "jitter": JITTER}


# -- the stub connector (its own process) -----------------------------------------------


def stub_connector(state_dir: str) -> None:
    """Answer core on the connector seam until SIGTERM; as cheap as a connector can be."""
    import msgspec
    import zmq

    from sensorium.shared.clock import rfc3339
    from sensorium.shared.config import connector_endpoint, load_node_config
    from sensorium.shared.paths import StatePaths
    from sensorium.shared.rpc.sockets import prepare_ipc
    from sensorium.shared.wire.deferred import DeferredOperationStatus
    from sensorium.shared.wire.envelope import Reply, WireError
    from sensorium.shared.wire.report import ConnectorAction, ModuleReport, RuntimeProbe
    from sensorium.shared.wire.seam import (
        ConnectorCancel,
        ConnectorReport,
        ConnectorStatus,
        ConnectorStatusBatch,
        ConnectorStatuses,
        ConnectorWatch,
        SeamRequestUnion,
    )

    paths = StatePaths(Path(state_dir))
    endpoint = connector_endpoint(load_node_config(paths), paths)
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(SeamRequestUnion)
    report = encoder.encode(
        ModuleReport(
            module_id=MODULE_ID,
            instance_id="stub-connector",
            started_at=rfc3339(),
            config_hash="sha256:" + "0" * 64,
            config_authorized=True,
            config_authorization="factory",
            catalog_exposed=True,
            connector_actions=[
                ConnectorAction(
                    action_id=ACTION_ID,
                    class_="read-only-spawn",
                    parameters_schema={"type": "object"},
                    default_timeout_ms=5000,
                    max_timeout_ms=10000,
                    execution_mode_support="either",
                    state="enabled",
                )
            ],
            declared_actions=[ACTION_ID],
            runtime=RuntimeProbe(platform="linux", uid=0),
        )
    )
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    prepare_ipc(endpoint)
    sock.bind(endpoint)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        frames = sock.recv_multipart()
        # DEALER peers send [payload]: route back on the identity (and any envelope).
        route, payload = frames[:-1], frames[-1]
        try:
            req = decoder.decode(payload)
        except msgspec.DecodeError as exc:
            print(f"stub connector: undecodable request: {exc}", file=sys.stderr)
            continue
        if isinstance(req, ConnectorStatus):
            status = DeferredOperationStatus(
                operation_id=req.operation_id,
                status="running",
                updated_at=rfc3339(),
                retry_after_seconds=RETRY_S,
            )
            reply = Reply(
                request_id=req.request_id, ok=True, result=msgspec.Raw(encoder.encode(status))
            )
        elif isinstance(req, ConnectorStatusBatch):
            batch = ConnectorStatuses(
                statuses=[
                    DeferredOperationStatus(
                        operation_id=op,
                        status="running",
                        updated_at=rfc3339(),
                        retry_after_seconds=RETRY_S,
                    )
                    for op in req.operation_ids
                ]
            )
            reply = Reply(
                request_id=req.request_id, ok=True, result=msgspec.Raw(encoder.encode(batch))
            )
        elif isinstance(req, ConnectorWatch):
            # No job ever ends here: answered as a connector without the watch would
            # (core then asks again only after a long pause), not held.
            reply = Reply(
                request_id=req.request_id,
                ok=False,
                error=WireError(code="request-malformed", message="the stub holds no watch"),
            )
        elif isinstance(req, ConnectorReport):
            reply = Reply(request_id=req.request_id, ok=True, result=msgspec.Raw(report))
        elif isinstance(req, ConnectorCancel):
            status = DeferredOperationStatus(
                operation_id=req.operation_id, status="cancelled", updated_at=rfc3339()
            )
            reply = Reply(
                request_id=req.request_id, ok=True, result=msgspec.Raw(encoder.encode(status))
            )
        else:
            reply = Reply(
                request_id=req.request_id,
                ok=False,
                error=WireError(code="internal", message="the stub connector runs no directives"),
            )
        try:
            sock.send_multipart([*route, encoder.encode(reply)])
        except zmq.ZMQError:
            pass  # core went away; its next connection asks again


# -- the runtime ---------------------------------------------------------------------


def _start(state_dir: Path, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    out = (state_dir / f"{name}.out").open("wb")
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    finally:
        out.close()


def _populate(state_dir: Path, n_ops: int) -> float:
    """Admit ``n_ops`` operations as core would (reserve, then confirm with the ack)."""
    from sensorium.shared.clock import rfc3339
    from sensorium.shared.config import load_node_config
    from sensorium.shared.deferred.policy import DeferredHostPolicy
    from sensorium.shared.deferred.registry import Registry, Reservation
    from sensorium.shared.paths import StatePaths
    from sensorium.shared.wire.deferred import ConnectorDeferred

    paths = StatePaths(state_dir)
    registry = Registry(
        paths.registry_db, DeferredHostPolicy.from_config(load_node_config(paths).deferred)
    )
    now = time.time()
    try:
        with registry.batch():
            for i in range(n_ops):
                op_id = f"deferred:sensorium.directive.invoke:bench-{i:05d}"
                registry.reserve(
                    Reservation(
                        operation_id=op_id,
                        operation_kind="sensorium.directive.invoke",
                        owner_module_id=MODULE_ID,
                        capability_id="sensorium.directive.invoke",
                        directive_id=f"directive-{i:05d}",
                        action_id=ACTION_ID,
                        correlation_id=None,
                        idempotency_key=None,
                        deadline_at=None,
                        preferred_ttl_s=None,
                        preferred_retry_s=None,
                        cancel_unavailable_reason=None,
                        audit_outcome_ref=f"outcome:bench-{i:05d}",
                        confirm_within_s=15.0,
                    ),
                    now,
                )
                registry.confirm(
                    op_id,
                    ConnectorDeferred(
                        operation_id=op_id,
                        status="running",
                        retry_after_seconds=RETRY_S,
                        created_at=rfc3339(now),
                        cancel_href=f"sensorium.connector.cancel?operation/id={op_id}",
                    ),
                    now,
                )
        counts = registry.counts()
    finally:
        registry.close()
    if counts.get("running") != n_ops:
        raise BenchError(f"registry holds {counts}, not {n_ops} running operations")
    return now


def _registry_totals(db: Path) -> tuple[int, dict[str, int]]:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    conn.set_busy_timeout(5000)
    try:
        attempts = conn.execute("SELECT coalesce(sum(attempts), 0) FROM operations").fetchone()
        statuses: list[Any] = conn.execute(
            "SELECT status, count(*) FROM operations GROUP BY status"
        ).fetchall()
    finally:
        conn.close()
    assert attempts is not None
    return int(attempts[0]), {str(s): int(n) for s, n in statuses}


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _stats_lines(log: Path) -> list[dict[str, Any]]:
    lines = []
    for text in log.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            continue
        if doc.get("event") == "poller.stats":
            lines.append(doc)
    return lines


# -- the run ---------------------------------------------------------------------------


def run(n_ops: int = N_OPS, duration_s: float = DURATION_S) -> dict[str, Any]:
    m = machine()
    state_dir = Path(tempfile.mkdtemp(prefix="sp-", dir="/tmp"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        (state_dir / "config").mkdir(parents=True)
        (state_dir / "config" / "node.json").write_text(json.dumps({"deferred": NODE_DEFERRED}))
        procs["stub-connector"] = _start(
            state_dir,
            "stub-connector",
            [PYTHON, str(Path(__file__).resolve()), "--stub-connector", str(state_dir)],
        )
        for name, module in (
            ("sensorium-core", "sensorium.core"),
            ("sensorium-poller", "sensorium.poller"),
        ):
            procs[name] = _start(
                state_dir, name, [PYTHON, "-m", module, "--state-dir", str(state_dir)]
            )
        wait_ready(Runtime(state_dir, procs), READY_TIMEOUT_S)
        db = state_dir / "storage" / "deferred-operations.sqlite"

        populated_at = _populate(state_dir, n_ops)
        # The window starts after the first due round, so it measures the steady state.
        time.sleep(max(0.0, populated_at + 2 * RETRY_S - time.time()))
        cpu0 = {name: _cpu_s(p.pid) for name, p in procs.items()}
        attempts0, _ = _registry_totals(db)
        t0 = time.perf_counter()
        time.sleep(duration_s)
        wall = time.perf_counter() - t0
        cpu1 = {name: _cpu_s(p.pid) for name, p in procs.items()}
        attempts1, statuses = _registry_totals(db)
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with {proc.returncode} during the run")
        # One more stats line covers the end of the window.
        time.sleep(STATS_INTERVAL_S / 2)
    finally:
        stop(procs)
    try:
        stats = _stats_lines(state_dir / "logs" / "poller.jsonl")
        poller_errors = [
            line
            for line in (state_dir / "logs" / "poller.jsonl").read_text().splitlines()
            if '"level":"error"' in line or '"level":"warning"' in line
        ]
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    if len(stats) < 3:
        raise BenchError(f"only {len(stats)} poller.stats lines in {duration_s:.0f} s")
    steady = stats[1:]  # the first line includes the start and the first claim of all 1,000
    polls = sum(int(s["polls"]) for s in steady)
    within = sum(float(s["within_250ms"]) * int(s["polls"]) for s in steady) / polls
    p50 = statistics.median(float(s["late_p50_ms"]) for s in steady)
    p99 = max(float(s["late_p99_ms"]) for s in steady)
    polls_per_s = (attempts1 - attempts0) / wall
    cpu = {name: 100 * (cpu1[name] - cpu0[name]) / wall for name in procs}
    rows = [
        row(
            BENCH,
            "polls within 250 ms of due",
            100 * within,
            100.0,
            unit="%",
            peer_name="ideal poller",
            higher_is_better=True,
        ),
        row(
            BENCH,
            f"polls/s ({n_ops} ops, retry {RETRY_S} s, jitter {JITTER})",
            polls_per_s,
            n_ops / (RETRY_S * (1 + JITTER / 2)),
            unit="polls/s",
            peer_name=f"ideal: {n_ops} ops / {RETRY_S * (1 + JITTER / 2):.1f} s mean interval",
            higher_is_better=True,
        ),
        row(BENCH, "lateness p50 (median of 10 s windows)", p50, None, unit="ms"),
        row(BENCH, "lateness p99 (worst 10 s window)", p99, None, unit="ms"),
        row(BENCH, "sensorium-poller CPU", cpu["sensorium-poller"], None, unit="% of a core"),
        row(BENCH, "sensorium-core CPU", cpu["sensorium-core"], None, unit="% of a core"),
        row(
            BENCH,
            "stub connector CPU (not Sensorium)",
            cpu["stub-connector"],
            None,
            unit="% of a core",
        ),
    ]
    dcfg = DeferredConfig(**NODE_DEFERRED)
    windows = "; ".join(
        f"{s['polls']} polls, {100 * float(s['within_250ms']):.1f}% ≤250 ms, "
        f"p50 {s['late_p50_ms']} ms, p99 {s['late_p99_ms']} ms"
        for s in stats
    )
    return {
        "name": "poller_punctuality",
        "machine": m,
        "rows": rows,
        "stats_lines": stats,
        "registry_statuses_at_end": statuses,
        "cpu_percent_of_core": cpu,
        "window_s": wall,
        "notes": [
            f"poller punctuality: {wall:.0f} s window, {attempts1 - attempts0} polls recorded; "
            f"deferred config {NODE_DEFERRED}: per_module_max_polls {dcfg.per_module_max_polls}, "
            f"max_concurrent_polls {dcfg.max_concurrent_polls} (every operation has one owner "
            f"module, {MODULE_ID}); "
            f"registry at the end: {statuses}",
            f"poller.stats windows (first one left out of the totals): {windows}",
            f"poller warnings/errors in the run: {len(poller_errors)}"
            + (f" (first: {poller_errors[0][:300]})" if poller_errors else ""),
        ],
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--stub-connector":
        stub_connector(sys.argv[2])
        return

    def options(p: Any) -> None:
        p.add_argument("--ops", type=int, default=N_OPS, help="open operations held")
        p.add_argument("--seconds", type=float, default=DURATION_S, help="measured window")

    args = parse_args(__doc__, options)
    emit(run(args.ops, args.seconds), args.json)


if __name__ == "__main__":
    main()
