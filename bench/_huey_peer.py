"""The huey side of deferred_peer.py: a SqliteHuey, its task, and the producer.

Runs in the peers' interpreter (bench/peers.sh) and imports no sensorium. The consumer is
``python -m huey.bin.huey_consumer _huey_peer.huey -w 8 -k thread …`` started by
deferred_peer.py; the producer is ``python -c "import _huey_peer; _huey_peer.main()"``
(imported by its name, so the task is registered under the name the consumer knows) and
prints one JSON document: enqueue latencies and completion times in ns.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from typing import Any

from _sweep import Check, Sweeper
from huey import SqliteHuey
from huey.api import Result
from huey.exceptions import TaskException

# fsync=True: synchronous=FULL, the durability sensorium's stores run at.
huey = SqliteHuey(
    "sensorium-bench", filename=os.environ.get("SENSORIUM_BENCH_HUEY_DB", "huey.db"), fsync=True
)


@huey.task()
def run_program(argv: list[str], timeout_s: float) -> int:
    """The bounded job: the program, captured output, killed past its timeout."""
    done = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=False
    )
    return done.returncode


def _final(res: Result) -> str | None:
    try:
        code = res.get()
    except TaskException:
        return "failed"  # it raised (a timeout, say): final all the same
    if code is None:
        return None
    return "completed" if code == 0 else "failed"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--sweep-timeout-s", type=float, default=120.0)
    parser.add_argument("argv", nargs="+")
    args = parser.parse_args()
    for res in [run_program(args.argv, args.timeout_s) for _ in range(args.warmup)]:
        res.get(blocking=True, timeout=30)

    def connect() -> tuple[Check, Any]:
        return _final, lambda: None

    sweeper = Sweeper(connect, args.jobs, args.sweep_timeout_s)
    sweeper.start()
    enqueue: list[int] = []
    for _ in range(args.jobs):
        t0 = time.perf_counter_ns()
        res = run_program(args.argv, args.timeout_s)
        t1 = time.perf_counter_ns()
        enqueue.append(t1 - t0)
        sweeper.add(res, t1)
    print(json.dumps({"enqueue_ns": enqueue, **sweeper.result()}))
