"""A time-bounded fuzz run over every input the node parses (not part of CI's tests).

The same targets as ``tests/property`` — client and seam requests as RpcServer decodes
them, replies and their results as clients do, catalog files, fs policies, argv
rendering, signature sidecars — with random (not derandomized) hypothesis examples until
``--seconds`` run out, split evenly between targets. Prints examples run per target,
verdicts by code, and crashes (anything but a verdict: an uncoded exception, a broken
invariant, an example over its time bound), which must be 0; exits 1 otherwise.

    python bench/fuzz_inputs.py --seconds 60
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "property"))

import fuzz_targets  # noqa: E402 - beside the property tests, found through sys.path

BATCH = 200  # examples per hypothesis run; runs repeat until the target's time is up


def _runner(target: fuzz_targets.Target, examples: int, record: Callable[[str], None]) -> Any:
    @settings(
        database=None,
        deadline=None,
        max_examples=examples,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(target.strategy)
    def run(case: Any) -> None:
        with fuzz_targets.bounded():
            record(target.run(case))

    return run


def fuzz(target: fuzz_targets.Target, seconds: float) -> dict[str, Any]:
    verdicts: collections.Counter[str] = collections.Counter()
    crashes: list[str] = []
    started = time.monotonic()
    batch = 20  # then sized so that the last batch ends near the deadline
    while (left := seconds - (time.monotonic() - started)) > 0:
        t0, before = time.monotonic(), sum(verdicts.values())
        try:
            _runner(target, batch, lambda v: verdicts.update([v]))()
        except Exception as exc:  # hypothesis re-raises the shrunk failing example
            where = traceback.format_exception(exc)[-6:]
            notes = "\n".join(getattr(exc, "__notes__", []))
            crashes.append(f"{''.join(where)}{notes[:3000]}")
        per = (time.monotonic() - t0) / max(sum(verdicts.values()) - before, 1)
        batch = max(1, min(BATCH, int((left - (time.monotonic() - t0)) / per)))
    return {
        "target": target.name,
        "examples": sum(verdicts.values()),
        "verdicts": dict(verdicts.most_common()),
        "crashes": crashes,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="total, split between targets")
    parser.add_argument("--target", action="append", help="only these (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sb-fuzz-"))
    try:
        chosen = [
            t
            for t in fuzz_targets.targets(fuzz_targets.SidecarWorld(root))
            if not args.target or t.name in args.target
        ]
        each = args.seconds / max(len(chosen), 1)
        results = []
        for target in chosen:
            print(f"fuzzing {target.name} for {each:.0f} s …", file=sys.stderr, flush=True)
            results.append(fuzz(target, each))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| target | examples | s | crashes | verdicts |\n|---|---:|---:|---:|---|")
    for r in results:
        codes = ", ".join(f"{code} {n}" for code, n in r["verdicts"].items())
        row = f"{r['target']} | {r['examples']} | {r['seconds']} | {len(r['crashes'])} | {codes}"
        print(f"| {row} |")
    crashes = [(r["target"], c) for r in results for c in r["crashes"]]
    for name, crash in crashes:
        print(f"\nCRASH in {name}:\n{crash}")
    print(f"\ncrashes: {len(crashes)} (must be 0)")
    if args.json:
        args.json.write_text(json.dumps({"name": "fuzz_inputs", "results": results}, indent=2))
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
