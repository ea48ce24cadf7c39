"""Where the machine's CPU goes while 16 sync ``bench.true`` directives are in flight.

Not a benchmark (not in ``run_all.py``) and needs ``perf`` (root, or
``perf_event_paranoid`` ≤ 0 for a system-wide profile). It starts the runtime as the
benchmarks do, runs ``invoke_true.py``'s throughput load (one ``AsyncClient``, 16
concurrent tasks) once to warm up, then again for ``--seconds`` under
``perf record -a -g`` (every CPU, call graphs), and prints:

- the share of all samples (idle included) taken by each command: the Python processes
  (core, connector, poller, the load's own client: all ``python``), the sandboxes while
  they are being built (``sensorium-exec-``: the exec stage, its parker and inits), the
  action itself (``true``), the kernel's workers;
- the share spent under each sandbox mechanism's kernel entry point (inclusive, from
  any process): creating a network namespace (``copy_net_ns``) and tearing it down
  (``cleanup_net``, in a kworker once the last process of the namespace is gone), the
  clone itself, mounts, exec, seccomp, exit;
- each of those as CPU µs per directive: share × CPUs × seconds ÷ directives;
- each process's own CPU per directive over the same window (``psutil``, user+system):
  this load's client, core, the connector, its zygote (Python), the parker (the C
  process that clones each parked sandbox) and the sandboxes (the zygote's reaped
  children: the inits and the actions).

That is the question the 16-in-flight goal asks: what a directive costs the machine, and
which of it is the isolation itself. Sampling adds a few per cent of load; compare
shares with each other, and throughput with ``invoke_true.py``.

    python bench/kernel_share.py --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _harness import runtime
from invoke_true import _throughput_core

# Kernel entry points of the sandbox's mechanisms, reported inclusively ("children").
MECHANISMS = {
    "copy_net_ns": "network namespace: create",
    "cleanup_net": "network namespace: tear down (kworker)",
    "__do_sys_clone": "clone (all namespaces, the copy of the process)",
    "copy_mnt_ns": "mount namespace: copy",
    "__x64_sys_mount": "mount(2)",
    "__x64_sys_execve": "execve",
    "do_seccomp": "seccomp (filter load)",
    "__do_sys_landlock_restrict_self": "Landlock (restrict_self)",
    "do_exit": "process exit",
}
_LINE = re.compile(r"^\s*([\d.]+)%\s+(?:([\d.]+)%\s+)?(.*?)\s*$")


def _report(data: Path, *args: str) -> list[tuple[float, str]]:
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "-g", "none", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = _LINE.match(line)
        if m is not None:
            rows.append((float(m.group(1)), m.group(3)))
    return rows


def _processes(connector: int, core: int) -> dict[str, psutil.Process]:
    """The processes of a directive's way, by role; the zygote and parker by what they
    run (the connector's other children come and go). The parked inits run the same
    program as the parker and are the zygote's children too (CLONE_PARENT): the parker
    is the oldest of them."""
    procs = {
        "the load (one AsyncClient)": psutil.Process(),
        "sensorium-core": psutil.Process(core),
        "sensorium-os": psutil.Process(connector),
    }
    for child in procs["sensorium-os"].children():
        with contextlib.suppress(psutil.Error):
            if any("zygote" in part for part in child.cmdline()):
                procs["zygote"] = child
                parking = []
                for grandchild in child.children():
                    with contextlib.suppress(psutil.Error):
                        if grandchild.cmdline()[-1:] == ["park"]:
                            parking.append((grandchild.create_time(), grandchild.pid))
                if parking:
                    procs["parker"] = psutil.Process(min(parking)[1])
    return procs


def _cpu(p: psutil.Process) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds, user+system."""
    t = p.cpu_times()
    return t.user + t.system, t.children_user + t.children_system


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="the profiled window")
    args = p.parse_args()
    if shutil.which("perf") is None:
        print("kernel_share: perf is not installed (Debian: linux-perf)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sb-kshare-", dir="/tmp"))
    data = work / "perf.data"
    try:
        with runtime() as rt:
            asyncio.run(_throughput_core(rt.state_dir, 2.0))  # warm: pools filled
            perf = subprocess.Popen(
                ["perf", "record", "-q", "-a", "-g", "-F", "1999", "-o", str(data)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            time.sleep(0.5)  # perf is attached before the load starts
            if perf.poll() is not None:
                why = perf.stderr.read().decode() if perf.stderr else ""
                print(f"kernel_share: perf record failed: {why.strip()}", file=sys.stderr)
                return 2
            procs = _processes(rt.procs["sensorium-os"].pid, rt.procs["sensorium-core"].pid)
            before = {name: _cpu(p) for name, p in procs.items()}
            load = asyncio.run(_throughput_core(rt.state_dir, args.seconds))
            after = {name: _cpu(p) for name, p in procs.items()}
            perf.send_signal(2)
            perf.wait(30)
        ncpu = len(os.sched_getaffinity(0))
        done, window = int(load["completed"]), float(load["elapsed_s"])
        # µs of CPU per directive for one per cent of all samples.
        per_pct = ncpu * window * 1e6 / 100 / max(done, 1)
        print(f"{done} directives in {window:.2f} s ({done / window:.1f}/s) on {ncpu} CPUs")
        print("\n| process | CPU µs per directive |\n|---|---:|")
        for name in procs:
            own = (after[name][0] - before[name][0]) / max(done, 1) * 1e6
            print(f"| {name} | {own:,.0f} |")
            if after[name][1] > before[name][1]:
                kids = (after[name][1] - before[name][1]) / max(done, 1) * 1e6
                print(f"| the sandboxes ({name}'s reaped children) | {kids:,.0f} |")
        print("\n| command | share of all samples | CPU µs per directive |\n|---|---:|---:|")
        for pct, comm in _report(data, "--no-children", "--sort", "comm")[:10]:
            print(f"| {comm} | {pct:.1f} % | {pct * per_pct:,.0f} |")
        found = {
            sym.split("] ", 1)[-1]: pct
            for pct, sym in _report(data, "--children", "--sort", "sym")
            if sym.split("] ", 1)[-1] in MECHANISMS
        }
        print("\n| kernel entry point | what | share | CPU µs per directive |\n|---|---|---:|---:|")
        for sym, what in MECHANISMS.items():
            pct = found.get(sym, 0.0)
            print(f"| `{sym}` | {what} | {pct:.1f} % | {pct * per_pct:,.0f} |")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
