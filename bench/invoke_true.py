"""End-to-end cost of a C1 invoke of ``/usr/bin/true``, against spawning it bare and in bwrap.

Latency — measured: blocking ``Client.invoke("bench.true", {})``, i.e. client → core
(admission) → OS connector → spawn of ``/usr/bin/true`` in its C1 (read-only-spawn)
envelope → outcome → core audits it to SQLite (fsync, group commit) → reply. Peers, in
the same process: ``subprocess.run(["/usr/bin/true"])``, and bubblewrap with comparable
namespaces (``bwrap --unshare-all --die-with-parent --new-session --ro-bind / / --tmpfs
/tmp --proc /proc --dev /dev /usr/bin/true``; empty, and said so, where bwrap cannot
run), issue 21's own bwrap peer word for word (``bwrap --unshare-net --unshare-pid
--die-with-parent --new-session --ro-bind / / --dev /dev --proc /proc /bin/true``: no user
namespace as root, so lighter; the issue's goals are stated against it), and util-linux
``unshare --user --map-root-user --pid --fork --net --mount --mount-proc /usr/bin/true``
(``_harness.UNSHARE_TRUE``). All interleaved in blocks after
a warm-up, timed with ``perf_counter_ns``; median and p99 and the ratios.
(class_spawn.py measures C2–C6 the same way; C1 is this.)

Throughput — measured: ONE ``AsyncClient`` with 16 concurrent asyncio tasks, each
invoking ``bench.true`` back to back for ~5 s; completed directives per second. Peers:
16 threads each running ``subprocess.run(["/usr/bin/true"])`` back to back for ~5 s, and
16 threads each running each of the two bwrap commands above the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from _harness import (
    BWRAP_ISSUE,
    BWRAP_TRUE,
    UNSHARE_TRUE,
    bwrap_missing,
    emit,
    machine,
    parse_args,
    row,
    runtime,
    summary_us,
    unshare_missing,
)

from sensorium.client import AsyncClient, Client

BENCH = "invoke bench.true (C1 read-only-spawn)"
PEER = "subprocess.run(true)"
PEER_BWRAP = "bwrap --unshare-all (true)"
PEER_ISSUE = "bwrap --unshare-net --unshare-pid (true), issue 21's own peer"
PEER_UNSHARE = "unshare -U -r -p -f -n -m --mount-proc (true)"
ACTION = "bench.true"
TRUE = ["/usr/bin/true"]
WARMUP = 50
ITERATIONS = 500
BLOCKS = 4
CONCURRENCY = 16
THROUGHPUT_S = 5.0


def invoke_once(client: Client, spawn_ns: list[int] | None = None) -> int:
    """One timed invoke; appends the connector-reported spawn duration to ``spawn_ns``."""
    t0 = time.perf_counter_ns()
    outcome = client.invoke(ACTION, {})
    elapsed = time.perf_counter_ns() - t0
    if outcome.status != "completed":
        raise AssertionError(f"{ACTION} did not complete: {outcome}")
    if spawn_ns is not None:
        spawn_ns.append(int(outcome.duration_ms * 1e6))
    return elapsed


def spawn_once(argv: list[str] = TRUE) -> int:
    t0 = time.perf_counter_ns()
    subprocess.run(argv, check=True)
    return time.perf_counter_ns() - t0


async def _throughput_core(state_dir: Path, seconds: float) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    async with AsyncClient(state_dir=str(state_dir)) as client:

        async def worker(deadline: int) -> None:
            while time.perf_counter_ns() < deadline:
                try:
                    outcome = await client.invoke(ACTION, {})
                except Exception as exc:  # counted, reported; the run goes on
                    statuses[f"error:{type(exc).__name__}:{exc}"] += 1
                else:
                    statuses[outcome.status] += 1

        # brief warm-up at full concurrency, not counted
        await asyncio.gather(*(client.invoke(ACTION, {}) for _ in range(CONCURRENCY)))
        start = time.perf_counter_ns()
        deadline = start + int(seconds * 1e9)
        await asyncio.gather(*(worker(deadline) for _ in range(CONCURRENCY)))
        elapsed = (time.perf_counter_ns() - start) / 1e9
    done = statuses.get("completed", 0)
    return {
        "completed": done,
        "elapsed_s": elapsed,
        "per_s": done / elapsed,
        "statuses": dict(statuses),
    }


def _throughput_spawn(seconds: float, argv: list[str] = TRUE) -> dict[str, Any]:
    counts = [0] * CONCURRENCY
    start = time.perf_counter_ns()
    deadline = start + int(seconds * 1e9)

    def worker(i: int) -> None:
        while time.perf_counter_ns() < deadline:
            subprocess.run(argv, check=True)
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = (time.perf_counter_ns() - start) / 1e9
    return {"completed": sum(counts), "elapsed_s": elapsed, "per_s": sum(counts) / elapsed}


def _cpu_s(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user+sys, including reaped children) each process has used so far;
    for the zygote, its live children's too: its parker (park.c), which makes every
    parked sandbox's namespaces (the clone's cost is the caller's), and parked inits."""
    out = {}
    for name, pid in pids.items():
        proc = psutil.Process(pid)
        t = proc.cpu_times()
        out[name] = t.user + t.system + t.children_user + t.children_system
        if name == "zygote+sandboxes":
            for child in proc.children():
                with contextlib.suppress(psutil.Error):
                    c = child.cpu_times()
                    out[name] += c.user + c.system + c.children_user + c.children_system
    return out


def _zygote(connector: int) -> dict[str, int]:
    """The connector's zygote, whose reaped children are every sandbox's init and target
    (their CPU is not the connector's until the zygote itself is reaped)."""
    for child in psutil.Process(connector).children():
        if "zygote" in " ".join(child.cmdline()):
            return {"zygote+sandboxes": child.pid}
    return {}


def run(iterations: int = ITERATIONS, seconds: float = THROUGHPUT_S) -> dict[str, Any]:
    m = machine()  # first, so the load average is not our own
    core: list[int] = []
    spawn: list[int] = []
    bwrap: list[int] = []
    issue: list[int] = []
    unshared: list[int] = []
    inside: list[int] = []  # Outcome.duration_ms: the spawn as the connector timed it
    no_bwrap = bwrap_missing()
    no_issue = bwrap_missing(BWRAP_ISSUE)
    no_unshare = unshare_missing()
    with runtime() as rt:
        with Client(state_dir=str(rt.state_dir)) as client:
            for _ in range(WARMUP):
                invoke_once(client)
                spawn_once()
                if no_bwrap is None:
                    spawn_once(BWRAP_TRUE)
                if no_issue is None:
                    spawn_once(BWRAP_ISSUE)
                if no_unshare is None:
                    spawn_once(UNSHARE_TRUE)
            per_block = iterations // BLOCKS
            for _ in range(BLOCKS):
                core.extend(invoke_once(client, inside) for _ in range(per_block))
                spawn.extend(spawn_once() for _ in range(per_block))
                if no_bwrap is None:
                    bwrap.extend(spawn_once(BWRAP_TRUE) for _ in range(per_block))
                if no_issue is None:
                    issue.extend(spawn_once(BWRAP_ISSUE) for _ in range(per_block))
                if no_unshare is None:
                    unshared.extend(spawn_once(UNSHARE_TRUE) for _ in range(per_block))
        pids = {**rt.pids, **_zygote(rt.pids["sensorium-os"])}
        before = _cpu_s(pids)
        tp_core = asyncio.run(_throughput_core(rt.state_dir, seconds))
        after = _cpu_s(pids)
        tp_spawn = _throughput_spawn(seconds)
        tp_bwrap = _throughput_spawn(seconds, BWRAP_TRUE) if no_bwrap is None else None
        tp_issue = _throughput_spawn(seconds, BWRAP_ISSUE) if no_issue is None else None
    c, s, d = summary_us(core), summary_us(spawn), summary_us(inside)
    b = summary_us(bwrap) if bwrap else None
    i = summary_us(issue) if issue else None
    u = summary_us(unshared) if unshared else None
    done = max(1, tp_core["completed"])
    cpu_ms = {name: (after[name] - before[name]) * 1000 / done for name in after}
    tp_core["cpu_ms_per_directive"] = cpu_ms
    bad = {k: v for k, v in tp_core["statuses"].items() if k != "completed"}
    notes = [
        f"invoke latency: {len(core)} sync invokes (and as many runs of each peer) after "
        f"{WARMUP} warm-up, interleaved in {BLOCKS} blocks; blocking Client, one directive "
        "at a time",
        f"invoke throughput: one AsyncClient, {CONCURRENCY} concurrent asyncio tasks, "
        f"{tp_core['elapsed_s']:.1f} s, {tp_core['completed']} completed; peer: "
        f"{CONCURRENCY} threads × subprocess.run, {tp_spawn['completed']} runs"
        + (f"; {CONCURRENCY} threads × bwrap, {tp_bwrap['completed']} runs" if tp_bwrap else "")
        + (
            f"; {CONCURRENCY} threads × issue 21's bwrap, {tp_issue['completed']} runs"
            if tp_issue
            else ""
        ),
        "invoke throughput: CPU per directive (user+sys incl. reaped children): "
        + ", ".join(f"{name} {ms:.2f} ms" for name, ms in cpu_ms.items()),
    ]
    if bad:
        notes.append(f"invoke throughput: NOT completed: {bad}")
    if no_bwrap is not None:
        notes.append(f"invoke latency: the bwrap column is empty: {no_bwrap}")
    if no_issue is not None:
        notes.append(f"invoke latency: the issue-21 bwrap column is empty: {no_issue}")
    if no_unshare is not None:
        notes.append(f"invoke latency: the unshare column is empty: {no_unshare}")
    return {
        "name": "invoke_true",
        "machine": m,
        "latency": {
            "core": c,
            "spawn": s,
            "bwrap": b,
            "bwrap_issue": i,
            "unshare": u,
            "outcome_duration": d,
        },
        "throughput": {
            "core": tp_core,
            "spawn": tp_spawn,
            "bwrap": tp_bwrap,
            "bwrap_issue": tp_issue,
            "concurrency": CONCURRENCY,
            "client": "one AsyncClient, 16 asyncio tasks",
        },
        "rows": _rows(
            c,
            d,
            tp_core["per_s"],
            {PEER: s, PEER_BWRAP: b, PEER_ISSUE: i, PEER_UNSHARE: u},
            {PEER: tp_spawn, PEER_BWRAP: tp_bwrap, PEER_ISSUE: tp_issue},
        ),
        "notes": notes,
    }


def _rows(
    core: dict[str, float],
    duration: dict[str, float],
    per_s: float,
    latency_peers: dict[str, dict[str, float] | None],
    throughput_peers: dict[str, dict[str, Any] | None],
) -> list[dict[str, Any]]:
    """Each figure next to each peer of the same run (an absent peer: an empty column)."""
    out = []
    for metric, key in (("median latency (sync)", "median_us"), ("p99 latency (sync)", "p99_us")):
        for peer, p in latency_peers.items():
            out.append(
                row(BENCH, metric, core[key], p[key] if p else None, unit="µs", peer_name=peer)
            )
    for peer, p in latency_peers.items():
        out.append(
            row(
                BENCH,
                "median Outcome.duration_ms (connector's own spawn timing)",
                duration["median_us"],
                p["median_us"] if p else None,
                unit="µs",
                peer_name=peer,
            )
        )
    for peer, t in throughput_peers.items():
        out.append(
            row(
                BENCH,
                f"throughput, {CONCURRENCY} in flight (1 AsyncClient)",
                per_s,
                t["per_s"] if t else None,
                unit="/s",
                peer_name=f"{peer} × {CONCURRENCY} threads",
                higher_is_better=True,
            )
        )
    return out


def main() -> None:
    def options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--iterations", type=int, default=ITERATIONS)
        p.add_argument("--seconds", type=float, default=THROUGHPUT_S, help="throughput run")

    args = parse_args(__doc__, options)
    emit(run(args.iterations, args.seconds), args.json)


if __name__ == "__main__":
    main()
