"""Soak under random kills: nothing lost, nothing spawned twice, memory flat.

Runs ``sensorium up`` (the supervisor and its three processes, started as an operator
would, on a fresh ``/tmp/sb-*`` state dir) for ``--seconds`` (10 min by default) under
mixed load — client threads sending keyed sync directives (``test.sleep``, 5 % with bad
parameters) and keyed async ones (``test.defer.sleep``) through the retrying ``Client``
— while a seeded killer SIGKILLs core, the connector, the poller or the supervisor every
few seconds (a killed supervisor is started again on the same state dir once its
children have stopped). Then the load stops, the node returns to READY and every
deferred operation is waited to its end.

Reported: directives sent; answered, by kind (outcome, rejected, in-doubt, retryable
after its retries, deferred handle, and how the handles ended); lost (sent but never
answered, or a handle that never ended: must be 0); duplicates (idempotency keys the
connector's ``action.started`` shows spawned more than once, or with two recorded
outcomes: must be 0); ``PRAGMA integrity_check`` of each store; RSS of each process
(core, connector, poller, supervisor) 3 s after the first READY, its peak, and at the
end. Not part of ``run_all.py``: it is long by design.
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from _harness import emit, machine, row

# The node, its test actions and the fault-injection tools are the test harness's.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import (
    CHAOS_ACTIONS,
    CHAOS_NODE,
    KeyedLoad,
    Killer,
    Stack,
    integrity,
    open_operations,
    outcomes_per_key,
    spawns_per_key,
    start_stack,
    wait_terminal,
)

from sensorium.shared.paths import StatePaths

BENCH = "soak under kills"
MIB = 1024 * 1024
PROCESSES = ("core", "connector", "poller", "supervisor")
SETTLE_S = 3.0


def _rss(stack: Stack) -> dict[str, float]:
    """RSS in MiB of each process of the stack now (those that answer)."""
    pids: dict[str, int | None] = {"supervisor": stack.proc.pid}
    try:
        pids.update(stack.pids())
    except Exception:  # the supervisor is between lives
        pass
    out: dict[str, float] = {}
    for name, pid in pids.items():
        if pid is None:
            continue
        try:
            out[name] = psutil.Process(pid).memory_info().rss / MIB
        except psutil.Error:
            continue
    return out


class Sampler(threading.Thread):
    """Each process's peak RSS, sampled every second (whichever incarnation runs)."""

    def __init__(self, killer: Killer) -> None:
        super().__init__(daemon=True)
        self.killer = killer
        self.peak: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for name, mib in _rss(self.killer.stack).items():
                self.peak[name] = max(self.peak.get(name, 0.0), mib)


def soak(seconds: float, seed: int, kill_every: tuple[float, float]) -> dict[str, Any]:
    m = machine()  # first, so the load average is not our own
    root = Path(tempfile.mkdtemp(prefix="sb-", dir="/tmp"))
    paths = StatePaths(root)
    stack = start_stack(paths, CHAOS_ACTIONS, CHAOS_NODE)
    killer: Killer | None = None
    try:
        stack.wait_ready()
        time.sleep(SETTLE_S)
        rss_start = _rss(stack)
        load = KeyedLoad(paths, seed, sync_threads=3, async_threads=2)
        killer = Killer(stack, seed, max_supervisor_kills=max(1, int(seconds // 120)))
        sampler = Sampler(killer)
        load.start()
        sampler.start()
        t0 = time.monotonic()
        killer.run(seconds, kill_every)
        stuck = load.stop()
        ran_s = time.monotonic() - t0
        stack = killer.stack
        stack.wait_ready(60)
        handles = [a.operation_id for a in load.answers if a.operation_id]
        final = wait_terminal(paths, handles, 60)
        still_open = open_operations(paths, 30)
        time.sleep(SETTLE_S)
        sampler.stop.set()
        rss_end = _rss(stack)
        spawns = spawns_per_key(paths)
        recorded_twice = sum(n > 1 for n in outcomes_per_key(paths).values())
        checks = integrity(paths)
        states = stack.states()
    finally:
        (killer.stack if killer else stack).stop()
        shutil.rmtree(root, ignore_errors=True)

    kinds = collections.Counter(a.kind for a in load.answers)
    codes = collections.Counter(f"{a.kind}:{a.code}" for a in load.answers if a.code)
    ended = collections.Counter(final.values())
    duplicates = sum(n > 1 for n in spawns.values()) + recorded_twice
    lost = load.sent - len(load.answers) + ended.get("open", 0)
    kills = collections.Counter(v for _t, v, _p in killer.kills)
    late = sum(a.elapsed_s > a.bound_s for a in load.answers)
    rows = [
        row(BENCH, "directives sent", load.sent, unit="directives"),
        *(
            row(BENCH, f"answered: {kind}", kinds.get(kind, 0), unit="directives")
            for kind in ("outcome", "rejected", "in-doubt", "retryable", "deferred")
        ),
        row(BENCH, "lost (must be 0)", lost, unit="directives"),
        row(BENCH, "keys spawned twice (must be 0)", duplicates, unit="keys"),
        row(BENCH, "SIGKILLs", sum(kills.values()), unit="kills"),
    ]
    for name in PROCESSES:
        rows.append(row(BENCH, f"{name} RSS at start", rss_start.get(name), unit="MiB"))
        rows.append(row(BENCH, f"{name} RSS peak", sampler.peak.get(name), unit="MiB"))
        rows.append(row(BENCH, f"{name} RSS at end", rss_end.get(name), unit="MiB"))
    notes = [
        f"soak: {ran_s:.0f} s of load, seed {seed}; kills {dict(kills)}",
        f"answers by code: {dict(codes)}; calls past their bound: {late}",
        f"deferred handles ended: {dict(ended)}; registry operations still open: {len(still_open)}",
        f"keys spawned (connector action.started): {len(spawns)}, max per key "
        f"{max(spawns.values(), default=0)}; keys with two recorded outcomes: "
        f"{recorded_twice}; client threads stuck: {stuck or 'none'}",
        f"integrity_check: {checks}; states at the end: {states}",
    ]
    return {
        "name": "soak",
        "machine": m,
        "seconds": ran_s,
        "seed": seed,
        "sent": load.sent,
        "answered": dict(kinds),
        "codes": dict(codes),
        "lost": lost,
        "duplicates": duplicates,
        "deferred_final": dict(ended),
        "registry_open": len(still_open),
        "kills": dict(kills),
        "rss_mib": {"start": rss_start, "peak": sampler.peak, "end": rss_end},
        "integrity": checks,
        "rows": rows,
        "notes": notes,
    }


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally that stops the node


def main() -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="load time (default 600)")
    parser.add_argument("--seed", type=int, help="the killer's and the load's seed")
    parser.add_argument(
        "--kill-every",
        type=float,
        nargs=2,
        default=(2.0, 6.0),
        metavar=("MIN_S", "MAX_S"),
        help="pause between kills, drawn uniformly (default 2 6)",
    )
    parser.add_argument("--json", type=Path, help="also write the result document here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    result = soak(args.seconds, seed, tuple(args.kill_every))
    emit(result, args.json)
    sys.exit(0 if result["lost"] == 0 and result["duplicates"] == 0 else 1)


if __name__ == "__main__":
    main()
