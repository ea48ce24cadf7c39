"""Run every benchmark, print one Markdown table, write ``bench/results.json``.

Each benchmark runs in its own interpreter (``python bench/NAME.py --json FILE``), one
after the other, so none shares sockets, contexts or warm caches with another. What each
measures and against which peer is in its own docstring and in bench/README.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import machine, markdown

HERE = Path(__file__).resolve().parent
BENCHES = [
    "rejected_roundtrip",
    "invoke_true",
    "class_spawn",
    "idle_rss",
    "authorization_cost",
    "registry_transitions",
    "poller_punctuality",
]
PER_BENCH_TIMEOUT_S = 120


def run_one(name: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / f"{name}.py"), "--json", str(out)]
    t0 = time.perf_counter_ns()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=PER_BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the benchmark's finally blocks stop what it started
        try:
            stdout, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        stderr += f"\n(run_all: timed out after {PER_BENCH_TIMEOUT_S} s)"
    wall = (time.perf_counter_ns() - t0) / 1e9
    if proc.returncode != 0 or not out.exists():
        return {
            "name": name,
            "ok": False,
            "wall_s": wall,
            "command": " ".join(cmd),
            "returncode": proc.returncode,
            "stdout": stdout,
            "stderr": stderr,
            "rows": [],
            "notes": [],
        }
    result: dict[str, Any] = json.loads(out.read_text())
    result.setdefault("name", name)  # not every script names itself in its document
    result.update(ok=True, wall_s=wall)
    return result


def main() -> int:
    started = time.perf_counter_ns()
    m = machine()  # before the runs, so the load average is the machine's, not ours
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sb-all-") as tmp:
        for name in BENCHES:
            print(f"running {name} …", file=sys.stderr, flush=True)
            results.append(run_one(name, Path(tmp) / f"{name}.json"))
    total = (time.perf_counter_ns() - started) / 1e9
    rows = [r for res in results for r in res["rows"]]
    print(markdown(rows, m))
    print()
    for res in results:
        for note in res["notes"]:
            print(f"- {note}")
    failed = [res for res in results if not res["ok"]]
    for res in failed:
        print(f"\n**{res['name']} FAILED** (exit {res['returncode']}): `{res['command']}`")
        print(f"```\n{res['stdout'][-4000:]}\n{res['stderr'][-4000:]}\n```")
    walls = ", ".join(f"{res['name']} {res['wall_s']:.1f} s" for res in results)
    print(f"\ntotal wall time {total:.1f} s ({walls})")
    doc = {"machine": m, "total_wall_s": total, "results": results, "rows": rows}
    (HERE / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
