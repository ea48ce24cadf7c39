"""Shared plumbing for the benchmarks: start/stop the runtime, statistics, machine facts.

Nothing here is measured; it only starts the three Sensorium processes exactly as an
operator would (``python -m sensorium.<x> --state-dir DIR``), waits until core reports
a connected connector, and tears everything down again however the benchmark ends.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from sensorium.client import Client, SensoriumError

PYTHON = sys.executable
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
PROFILE_ENV = "SENSORIUM_BENCH_PROFILE"

# name in results -> module run with ``python -m``
PROCESSES: dict[str, str] = {
    "sensorium-os": "sensorium.connectors.os",
    "sensorium-core": "sensorium.core",
    "sensorium-poller": "sensorium.poller",
}

BENCH_TRUE_DROPIN: dict[str, Any] = {
    "schema": "sensorium-os-config.v1",
    "action_catalog": [
        {
            "action_id": "bench.true",
            "class": "read-only-spawn",
            "executable": {"kind": "binary", "path": "/usr/bin/true", "argv_shape": ["true"]},
            "parameters_schema": {
                "type": "object",
                "properties": {},
                "additionalProperties": False,
            },
            "default_timeout_ms": 5000,
            "max_timeout_ms": 10000,
        }
    ],
}

# The bubblewrap peer of a C1 spawn: comparable namespaces (user, mount, pid, net, ipc,
# uts, cgroup), a read-only root, a private /tmp, /proc and /dev, a new session, killed
# with its parent; the same /usr/bin/true.
BWRAP_TRUE = [
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--ro-bind",
    "/",
    "/",
    "--tmpfs",
    "/tmp",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "/usr/bin/true",
]


# Issue 21's own peer, word for word: a new pid and network namespace (and the mount
# namespace bwrap always makes), the root read-only, /dev and /proc; as root it makes no
# user namespace, so it is lighter than BWRAP_TRUE and than Sensorium's C1 envelope. The
# issue's goals are stated against this command; BWRAP_TRUE is the like-for-like one.
BWRAP_ISSUE = [
    "bwrap",
    "--unshare-net",
    "--unshare-pid",
    "--die-with-parent",
    "--new-session",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "/bin/true",
]


# The util-linux peer, run beside bwrap in the same run (and the only isolation peer
# where bubblewrap is not installed): fresh user, pid, net and mount namespaces with
# their own /proc, a forked child; the same /usr/bin/true.
UNSHARE_TRUE = [
    "unshare",
    "--user",
    "--map-root-user",
    "--pid",
    "--fork",
    "--net",
    "--mount",
    "--mount-proc",
    "/usr/bin/true",
]


def unshare_missing() -> str | None:
    """Why the unshare peer cannot run here, or None."""
    if shutil.which(UNSHARE_TRUE[0]) is None:
        return "util-linux unshare is not installed"
    res = subprocess.run(UNSHARE_TRUE, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        return f"unshare fails here: {res.stderr.strip()[:200]}"
    return None


def bwrap_missing(argv: list[str] = BWRAP_TRUE) -> str | None:
    """Why a bwrap peer cannot run here (not installed, or refused), or None."""
    if shutil.which(argv[0]) is None:
        return "bubblewrap is not installed"
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        return f"bwrap fails here: {res.stderr.strip()[:200]}"
    return None


class BenchError(RuntimeError):
    """The runtime could not be brought up; the message says what was seen."""


@dataclass
class Runtime:
    state_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ready_after_s: float = 0.0

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items()}


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(missing)"


def _diagnose(rt: Runtime) -> str:
    parts = []
    for name, proc in rt.procs.items():
        module = PROCESSES.get(name, name)
        parts.append(
            f"$ {PYTHON} -m {module} --state-dir {rt.state_dir}  "
            f"(pid {proc.pid}, returncode {proc.poll()})"
        )
        parts.append(f"--- stdout+stderr ({name}.out):\n{_tail(rt.state_dir / f'{name}.out')}")
    for log in sorted((rt.state_dir / "logs").glob("*.jsonl")):
        parts.append(f"--- {log.name}:\n{_tail(log, 10)}")
    return "\n".join(parts)


def wait_ready(rt: Runtime, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no reply yet"
    with Client(state_dir=str(rt.state_dir), connect_timeout_s=0.5) as client:
        while time.monotonic() < deadline:
            for name, proc in rt.procs.items():
                if proc.poll() is not None:
                    raise BenchError(
                        f"{name} exited with {proc.returncode} during startup\n" + _diagnose(rt)
                    )
            try:
                health = client.health()
            except SensoriumError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if health.connector is not None and health.connector.actions > 0:
                    return
                last = f"health: {health}"
            time.sleep(0.05)
    raise BenchError(f"core not ready within {timeout_s:.0f}s (last: {last})\n" + _diagnose(rt))


def stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """terminate → wait → kill every process we started, each by its own pid."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)


def _sign(state_dir: Path) -> None:
    """Sign the edited catalog as an operator would (strict posture refuses it otherwise)."""
    from sensorium.connectors.os.catalog.authorization import sign_effective
    from sensorium.shared.keys import new_operator_key, trust_signer
    from sensorium.shared.paths import StatePaths

    paths = StatePaths(state_dir)
    paths.ensure()
    pair, _path = new_operator_key(paths, "did:bench:operator")
    trust_signer(paths, pair)
    sign_effective(paths, pair)


def _profiled(name: str) -> list[str]:
    """``-m cProfile -o DIR/NAME.prof`` when $SENSORIUM_BENCH_PROFILE names a directory
    (written when the process exits on SIGTERM; read it with ``pstats``)."""
    out = os.environ.get(PROFILE_ENV)
    return ["-m", "cProfile", "-o", str(Path(out) / f"{name}.prof")] if out else []


@contextmanager
def runtime(
    *, bench_true: bool = True, keep: bool = False, dropin: dict[str, Any] | None = None
) -> Iterator[Runtime]:
    """A fresh state dir with the three processes running and core ready."""
    state_dir = Path(tempfile.mkdtemp(prefix="sb-", dir="/tmp"))
    rt = Runtime(state_dir=state_dir)
    try:
        if bench_true:
            dropins = state_dir / "config" / "connectors" / "sensorium-os.d"
            dropins.mkdir(parents=True)
            (dropins / "bench.json").write_text(json.dumps(dropin or BENCH_TRUE_DROPIN))
            _sign(state_dir)
        started = time.perf_counter_ns()
        for name, module in PROCESSES.items():
            out = (state_dir / f"{name}.out").open("wb")
            try:
                rt.procs[name] = subprocess.Popen(
                    [PYTHON, *_profiled(name), "-m", module, "--state-dir", str(state_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            finally:
                out.close()
        wait_ready(rt, READY_TIMEOUT_S)
        rt.ready_after_s = (time.perf_counter_ns() - started) / 1e9
        yield rt
    finally:
        stop(rt.procs)
        if not keep:
            shutil.rmtree(state_dir, ignore_errors=True)


# -- statistics ---------------------------------------------------------------


def percentile(samples: Sequence[int], q: float) -> float:
    """Nearest-rank percentile of ``samples`` (ns) in microseconds."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1] / 1000


def summary_us(samples: Sequence[int]) -> dict[str, float]:
    return {
        "n": len(samples),
        "median_us": percentile(samples, 50),
        "p99_us": percentile(samples, 99),
        "min_us": min(samples) / 1000,
    }


# -- machine ------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def revision() -> str:
    """The commit under test, with ``+dirty`` when the work tree differs from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def machine() -> dict[str, Any]:
    tmp_fs = "unknown"
    best = ""
    for part in psutil.disk_partitions(all=True):
        if "/tmp".startswith(part.mountpoint) and len(part.mountpoint) > len(best):
            best, tmp_fs = part.mountpoint, f"{part.fstype} on {part.mountpoint}"
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "state_dir_fs": tmp_fs,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "revision": revision(),
    }


# -- reporting ----------------------------------------------------------------


def row(
    bench: str,
    metric: str,
    sensorium: float | None,
    peer: float | None = None,
    *,
    unit: str,
    peer_name: str = "",
    higher_is_better: bool = False,
) -> dict[str, Any]:
    """One line of the results table; ``ratio`` is always sensorium / peer."""
    ratio = sensorium / peer if sensorium is not None and peer else None
    return {
        "bench": bench,
        "metric": metric,
        "unit": unit,
        "sensorium": sensorium,
        "peer": peer,
        "peer_name": peer_name,
        "ratio": ratio,
        "higher_is_better": higher_is_better,
    }


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "µs":
        return f"{value:,.0f} µs" if value >= 100 else f"{value:.1f} µs"
    return f"{value:,.1f} {unit}"


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"nproc={m['nproc']} · {m['cpu_model']} · kernel {m['kernel']} · "
        f"Python {m['python']} · state dir on {m['state_dir_fs']} · "
        f"1-min load {m['loadavg_1m']} · revision {m['revision']}"
    )


def markdown(rows: list[dict[str, Any]], m: dict[str, Any]) -> str:
    lines = [
        f"**Machine:** {machine_line(m)}",
        "",
        "| benchmark | metric | sensorium | peer | peer value | ratio (sensorium/peer) |",
        "|---|---|---:|---|---:|---:|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.2f}×" if r["ratio"] is not None else "–"
        lines.append(
            f"| {r['bench']} | {r['metric']} | {_fmt(r['sensorium'], r['unit'])} | "
            f"{r['peer_name'] or '–'} | {_fmt(r['peer'], r['unit'])} | {ratio} |"
        )
    return "\n".join(lines)


# -- CLI ----------------------------------------------------------------------


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through every ``finally`` that stops processes


def parse_args(
    description: str | None, extra: Callable[[argparse.ArgumentParser], object] | None = None
) -> argparse.Namespace:
    """The common CLI (``extra`` adds a script's own options, e.g. a smaller N for a quick
    try); also makes SIGTERM run the cleanup instead of killing us outright."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(description=(description or "").split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the result document here")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def emit(result: dict[str, Any], json_path: Path | None) -> None:
    """Print the script's own table (and notes); write the JSON document if asked."""
    print(markdown(result["rows"], result["machine"]))
    for note in result.get("notes", []):
        print(f"- {note}")
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
