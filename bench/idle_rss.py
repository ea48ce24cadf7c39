"""Resident memory of the three Sensorium processes when idle.

Measured: sensorium-os, sensorium-core and sensorium-poller started from a fresh state
dir (``python -m sensorium.<x> --state-dir DIR``), once core reports a connected
connector and then 3 s of idleness: RSS (and USS, memory unique to the process) of each,
read with psutil, in MiB. Peer: a bare ``python -c "import time; time.sleep(60)"``
interpreter from the same venv, started at the same time, as the floor any Python
process pays.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import psutil
from _harness import PYTHON, emit, machine, parse_args, row, runtime, stop

BENCH = "idle memory"
PEER = "bare python (sleep)"
IDLE_S = 3.0
MIB = 1024 * 1024


def _mem(pid: int) -> dict[str, float]:
    info = psutil.Process(pid).memory_full_info()
    return {"rss_mib": info.rss / MIB, "uss_mib": info.uss / MIB}


def run() -> dict[str, Any]:
    m = machine()  # first, so the load average is not our own
    peer = {
        "bare": subprocess.Popen(
            [PYTHON, "-c", "import time; time.sleep(60)"], stdin=subprocess.DEVNULL
        )
    }
    try:
        with runtime(bench_true=False) as rt:
            time.sleep(IDLE_S)
            procs = {name: _mem(pid) for name, pid in rt.pids.items()}
            bare = _mem(peer["bare"].pid)
            ready_after = rt.ready_after_s
    finally:
        stop(peer)
    total = sum(p["rss_mib"] for p in procs.values())
    rows = [
        row(BENCH, f"{name} RSS", m["rss_mib"], bare["rss_mib"], unit="MiB", peer_name=PEER)
        for name, m in procs.items()
    ]
    rows.append(
        row(
            BENCH,
            "total RSS (3 processes)",
            total,
            3 * bare["rss_mib"],
            unit="MiB",
            peer_name=f"3 × {PEER}",
        )
    )
    uss = ", ".join(f"{name} {m['uss_mib']:.1f}" for name, m in procs.items())
    return {
        "name": "idle_rss",
        "machine": m,
        "processes": procs,
        "bare_python": bare,
        "ready_after_s": ready_after,
        "rows": rows,
        "notes": [
            f"idle memory: measured {IDLE_S:.0f} s after ready (ready {ready_after:.2f} s "
            f"after spawn); USS MiB: {uss}; bare python USS {bare['uss_mib']:.1f}"
        ],
    }


def main() -> None:
    args = parse_args(__doc__)
    emit(run(), args.json)


if __name__ == "__main__":
    main()
