"""Where a sync C1 spawn's time goes: a kernel-event timeline of the zygote's subtree.

Not a benchmark (not in ``run_all.py``) and needs ``perf`` with tracepoints (root, or
``perf_event_paranoid`` ≤ 1). It starts the runtime as the benchmarks do, warms up, then
attaches ``perf record`` to the connector and its zygote (events are inherited by every
process they fork from then on) and sends ``--iterations`` sync ``bench.true`` invokes,
one at a time, ``--gap-ms`` apart. Each spawn is cut into marks relative to the moment the
zygote receives the plan; a mark is the first event of that kind, in that spawn's
window (up to the next plan), in a process at that depth below the zygote (d0 = the
zygote, d1 = an init it clones, d2 = the target the init forks; "connector" = the
connector's own, from 3 ms before the zygote hears of the spawn). With parked inits a
window holds the spawn's own init and target and the next init parked (its mounts). Printed:
the median of each mark over all spawns, then the e2e and ``Outcome.duration_ms``
medians of the same invokes. Tracing slows what it traces; compare before and after
under the same tool, and the ratios against ``invoke_true.py``'s peers, not these
absolute times.

    python bench/spawn_profile.py --iterations 40
"""

from __future__ import annotations

import argparse
import bisect
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil
from _harness import runtime

from sensorium.client import Client

EVENTS = [
    "sched:sched_process_fork",
    "sched:sched_process_exec",
    "sched:sched_process_exit",
    "syscalls:sys_enter_recvmsg",
    "syscalls:sys_exit_recvmsg",
    "syscalls:sys_enter_sendmsg",
    "syscalls:sys_enter_unshare",
    "syscalls:sys_exit_unshare",
    "syscalls:sys_enter_mount",
    "syscalls:sys_exit_mount",
    "syscalls:sys_enter_setsid",
    "syscalls:sys_enter_landlock_create_ruleset",
    "syscalls:sys_enter_seccomp",
    "syscalls:sys_exit_seccomp",
    "syscalls:sys_enter_execve",
    "syscalls:sys_enter_exit_group",
    "syscalls:sys_enter_fdatasync",
    "syscalls:sys_exit_fdatasync",
]
CONNECTOR_LEAD_MS = 3.0
LINE = re.compile(r"\s*(\S+)\s+(\d+)/(\d+)\s+([\d.]+):\s+\S+:(\S+):\s*(.*)")


def record(iterations: int, gap_s: float, data: Path) -> tuple[int, int, list[float], list[float]]:
    """Run the invokes under perf; (connector pid, zygote pid, e2e ms, duration ms)."""
    e2e: list[float] = []
    inside: list[float] = []
    with runtime() as rt, Client(state_dir=str(rt.state_dir)) as client:
        for _ in range(30):
            client.invoke("bench.true", {})
        connector = psutil.Process(rt.pids["sensorium-os"])
        zygote = next(p for p in connector.children() if "zygote" in " ".join(p.cmdline()))
        pids = f"{connector.pid},{zygote.pid}"
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-o", str(data), "-e", ",".join(EVENTS), "-p", pids]
        )
        try:
            time.sleep(1.0)
            for _ in range(iterations):
                t0 = time.perf_counter_ns()
                out = client.invoke("bench.true", {})
                e2e.append((time.perf_counter_ns() - t0) / 1e6)
                inside.append(out.duration_ms)
                time.sleep(gap_s)
            time.sleep(0.3)
        finally:
            perf.send_signal(2)
            perf.wait(30)
    return connector.pid, zygote.pid, e2e, inside


def marks(script: str, connector: int, zygote: int) -> dict[str, list[float]]:
    """Per mark, its time after the zygote received each plan (ms)."""
    events = []
    for line in script.splitlines():
        m = LINE.match(line)
        if m:
            _comm, pid, _tid, t, event, rest = m.groups()
            events.append((float(t) * 1000, int(pid), event, rest))
    recvs = [t for t, pid, event, _ in events if pid == zygote and event == "sys_enter_recvmsg"]
    spawns: list[dict[str, float]] = [{} for _ in recvs]
    parent: dict[int, int] = {}
    for t, pid, event, rest in events:
        if event == "sched_process_fork":
            child = int(re.search(r"child_pid=(\d+)", rest).group(1))  # type: ignore[union-attr]
            parent[child] = pid
        # By time, not by lineage: a parked init (pool.py) is forked in one spawn's
        # window and runs the next one's plan.
        i = bisect.bisect_right(recvs, t + (CONNECTOR_LEAD_MS if pid == connector else 0)) - 1
        if pid == connector:
            key = f"connector {event}"
        elif pid == zygote:
            key = f"d0 {event}"
        else:
            depth, p = 0, pid
            while p != zygote and p in parent:
                p, depth = parent[p], depth + 1
            if p != zygote:
                continue
            key = f"d{depth} {event}"
        if 0 <= i < len(spawns):
            spawns[i].setdefault(key, t - recvs[i])
    out: dict[str, list[float]] = defaultdict(list)
    for s in spawns:
        for k, v in s.items():
            out[k].append(v)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--gap-ms", type=float, default=30.0)
    args = p.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf is not installed")
    with tempfile.TemporaryDirectory(prefix="spawn-profile-") as tmp:
        data = Path(tmp) / "perf.data"
        connector, zygote, e2e, inside = record(args.iterations, args.gap_ms / 1000, data)
        script = subprocess.run(
            ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,time,event,trace"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found = marks(script, connector, zygote)
    print(f"{args.iterations} sync invokes of bench.true, perf attached; marks after the zygote")
    print("received the plan (median over spawns, ms; n = spawns with that mark):")
    for key, values in sorted(found.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  {statistics.median(values):8.3f}  n={len(values):3d}  {key}")
    print(f"e2e median {statistics.median(e2e):.2f} ms; Outcome.duration_ms median ", end="")
    print(f"{statistics.median(inside):.2f} ms (both slowed by the tracing)")


if __name__ == "__main__":
    main()
