"""Run every benchmark, print one Markdown table, write ``bench/results.json``.

Each benchmark runs in its own interpreter (``python bench/NAME.py --json FILE``), one
after the other, so none shares sockets, contexts or warm caches with another. What each
measures and against which peer is in its own docstring and in bench/README.md.

``--readme`` also publishes the run: the table (machine and date in its header) replaces
the block between ``<!-- bench-table:begin -->`` and ``<!-- bench-table:end -->`` in the
top-level README.md, and ``bench/RESULTS.md`` gets the table with every note and failure.
The peers (huey, circus) are installed first with bench/peers.sh when no interpreter has
them (``--no-install`` skips that; their columns are then empty and say why).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import machine, markdown
from _peers import ensure_peers

HERE = Path(__file__).resolve().parent
# The published table lives in the performance guide (the README links to it).
README = HERE.parent / "docs" / "performance.md"
RESULTS_MD = HERE / "RESULTS.md"
BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"
KEEP = "<!-- kept by run_all.py -->"
# name -> timeout (s); each normally takes well under half of it (2 cores, loaded).
BENCHES: dict[str, float] = {
    "rejected_roundtrip": 90,
    "invoke_true": 120,
    "class_spawn": 120,
    "deferred_peer": 180,
    "deferred_idle": 180,
    "restart_peer": 180,
    "idle_rss": 60,
    "authorization_cost": 90,
    "registry_transitions": 120,
    "replay_capacity": 90,
    "poller_punctuality": 150,
}


def _failed(
    name: str, wall: float, command: str, code: int | None, out: str, err: str
) -> dict[str, Any]:
    return {
        "name": name,
        "ok": False,
        "wall_s": wall,
        "command": command,
        "returncode": code,
        "stdout": out,
        "stderr": err,
        "rows": [],
        "notes": [],
    }


def run_one(name: str, timeout_s: float, out: Path) -> dict[str, Any]:
    script = HERE / f"{name}.py"
    cmd = [sys.executable, str(script), "--json", str(out)]
    if not script.exists():
        return _failed(name, 0.0, " ".join(cmd), None, "", f"missing: {script} does not exist")
    t0 = time.perf_counter_ns()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the benchmark's finally blocks stop what it started
        try:
            stdout, stderr = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        stderr += f"\n(run_all: timed out after {timeout_s:.0f} s)"
    wall = (time.perf_counter_ns() - t0) / 1e9
    if proc.returncode != 0 or not out.exists():
        return _failed(name, wall, " ".join(cmd), proc.returncode, stdout, stderr)
    result: dict[str, Any] = json.loads(out.read_text())
    result.setdefault("name", name)  # not every script names itself in its document
    result.update(ok=True, wall_s=wall)
    return result


def _load(result: dict[str, Any]) -> str:
    return str(result.get("machine", {}).get("loadavg_1m", "?"))


def report(results: list[dict[str, Any]], m: dict[str, Any], total: float) -> str:
    """The whole run in Markdown: table, notes, failures, wall times."""
    rows = [r for res in results for r in res["rows"]]
    lines = [markdown(rows, m), ""]
    lines += [f"- {note}" for res in results for note in res["notes"]]
    for res in results:
        if res["ok"]:
            continue
        code = "missing" if res["returncode"] is None else f"exit {res['returncode']}"
        lines.append(f"\n**{res['name']} FAILED** ({code}): `{res['command']}`")
        lines.append(f"```\n{res['stdout'][-4000:]}\n{res['stderr'][-4000:]}\n```")
    walls = ", ".join(f"{res['name']} {res['wall_s']:.1f} s (load {_load(res)})" for res in results)
    lines.append(f"\ntotal wall time {total:.1f} s; each bench and the 1-min load it saw: {walls}")
    return "\n".join(lines)


def publish(results: list[dict[str, Any]], m: dict[str, Any], total: float, when: str) -> None:
    """The performance guide's block (table only) and bench/RESULTS.md (everything)."""
    rows = [r for res in results for r in res["rows"]]
    failed = [res["name"] for res in results if not res["ok"]]
    block = [
        f"Measured {when} with `python bench/run_all.py --readme`; what each row measures, "
        "and the notes of this run, are in [bench/RESULTS.md](../bench/RESULTS.md) and "
        "[bench/README.md](../bench/README.md). Ratios are sensorium / peer.",
        "",
        markdown(rows, m),
    ]
    if failed:
        block += ["", f"Did not run to completion (see bench/RESULTS.md): {', '.join(failed)}."]
    text = README.read_text()
    head, sep, rest = text.partition(BEGIN)
    _old, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{README}: markers {BEGIN} … {END} not found")
    README.write_text(head + BEGIN + "\n" + "\n".join(block) + "\n" + END + tail)
    # Hand-measured sections (before/after comparisons, profiles) below KEEP survive.
    old = RESULTS_MD.read_text() if RESULTS_MD.exists() else ""
    kept = old[old.index(KEEP) :] if KEEP in old else ""
    RESULTS_MD.write_text(
        f"# Benchmark results\n\nMeasured {when} with `python bench/run_all.py --readme` "
        "(what each script measures: bench/README.md).\n\n"
        + report(results, m, total)
        + "\n"
        + ("\n" + kept if kept else "")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--readme", action="store_true", help="publish: README block, RESULTS.md")
    parser.add_argument("--no-install", action="store_true", help="do not run bench/peers.sh")
    parser.add_argument("--only", nargs="+", choices=list(BENCHES), help="run just these")
    args = parser.parse_args()
    if args.readme and args.only:
        parser.error("--readme publishes a whole run; it does not go with --only")
    if not args.no_install:
        try:
            ensure_peers()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            print(
                f"run_all: peers not installed ({exc}); their columns stay empty", file=sys.stderr
            )
    started = time.perf_counter_ns()
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    m = machine()  # before the runs, so the load average is the machine's, not ours
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sb-all-") as tmp:
        for name, timeout_s in BENCHES.items():
            if args.only and name not in args.only:
                continue
            print(f"running {name} …", file=sys.stderr, flush=True)
            results.append(run_one(name, timeout_s, Path(tmp) / f"{name}.json"))
    total = (time.perf_counter_ns() - started) / 1e9
    print(report(results, m, total))
    rows = [r for res in results for r in res["rows"]]
    doc = {"machine": m, "when": when, "total_wall_s": total, "results": results, "rows": rows}
    (HERE / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    if args.readme:
        publish(results, m, total, when)
    return 1 if any(not res["ok"] for res in results) else 0


if __name__ == "__main__":
    sys.exit(main())
