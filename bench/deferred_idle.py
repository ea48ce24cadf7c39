"""What waiting costs: CPU of core, connector and poller while N deferred operations
sit open at the host's 1 s retry minimum, on a real node (no stub).

``N`` async ``bench.sleep`` jobs of 60 s (200, then 1,000 in a fresh node, by default) are admitted
(``deferred_peer.py``'s drop-in: retry hint 1 s): 8 run, the rest wait in the
connector's queue, and the poller polls every one of them about once a second
(1–1.2 s, the default jitter) through core and the connector. After a settling pause,
CPU (user + system, psutil) of each process over ``--seconds`` (20 by default) is
reported as % of one core. The goals of issue 21: ≤ 6 % for the three together at 200,
≤ 30 % at 1,000. There is no peer: the figures are absolute.
"""

from __future__ import annotations

import time
from typing import Any

import psutil
from _harness import emit, machine, parse_args, row, runtime
from deferred_peer import SLEEP_ACTION, dropin

from sensorium.client import Client

BENCH = "deferred operations waiting (real node)"
N_OPS = (200, 1000)
SECONDS = 20.0
SETTLE_S = 3.0


def _one(n_ops: int, seconds: float) -> tuple[dict[str, float], int, float]:
    """CPU (% of one core) per process with ``n_ops`` open; how many stayed open; wall."""
    with runtime(dropin=dropin()) as rt, Client(state_dir=str(rt.state_dir)) as client:
        for _ in range(n_ops):
            client.invoke(SLEEP_ACTION, {"seconds": "60"}, mode="async")
        time.sleep(SETTLE_S)
        procs = {name: psutil.Process(p.pid) for name, p in rt.procs.items()}
        before = {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}
        t0 = time.perf_counter()
        time.sleep(seconds)
        wall = time.perf_counter() - t0
        after = {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}
        open_ops = len(client.operations(limit=n_ops, open_only=True).operations)
    return {name: 100 * (after[name] - before[name]) / wall for name in procs}, open_ops, wall


def run(counts: tuple[int, ...] = N_OPS, seconds: float = SECONDS) -> dict[str, Any]:
    m = machine()
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    cpu_by_count: dict[int, dict[str, float]] = {}
    for n_ops in counts:
        cpu, open_ops, wall = _one(n_ops, seconds)
        cpu_by_count[n_ops] = cpu
        rows += [
            row(BENCH, f"{name} CPU, {n_ops:,} open", v, None, unit="% of a core")
            for name, v in cpu.items()
        ]
        rows.append(
            row(BENCH, f"all three, {n_ops:,} open", sum(cpu.values()), None, unit="% of a core")
        )
        notes.append(
            f"deferred idle: {n_ops:,} async 60 s sleeps admitted (8 run, the rest queue), "
            f"{open_ops:,} still open at the end; CPU over {wall:.0f} s after {SETTLE_S:.0f} s"
        )
    return {
        "name": "deferred_idle",
        "machine": m,
        "cpu_percent_of_core": cpu_by_count,
        "rows": rows,
        "notes": notes,
    }


def main() -> None:
    def options(p: Any) -> None:
        p.add_argument("--ops", type=int, nargs="+", default=list(N_OPS))
        p.add_argument("--seconds", type=float, default=SECONDS)

    args = parse_args(__doc__, options)
    emit(run(tuple(args.ops), args.seconds), args.json)


if __name__ == "__main__":
    main()
