"""Restart time after ``kill -9`` of sensorium-core: Sensorium's supervisor against Circus.

The same program under both: the three processes (``python -m sensorium.<x> --state-dir
DIR``, the same venv, the same ``config/node.json``), once as children of ``python -m
sensorium.supervisor`` and once as three Circus watchers (``circusd`` from the peers'
interpreter, see bench/peers.sh). The victim is core, the front door.

Measured, by the same external probe for both: from just before ``os.kill(core,
SIGKILL)`` until a new core instance (``instance/id`` differs) answers ``health`` with
a connected connector exposing its actions, i.e. the point at which the harness calls a
node ready. The probe waits until the old process has no thread left, then tries a plain
AF_UNIX connect to core's ipc socket every 2 ms (no ZMQ reconnect back-off in the way),
then asks ``health`` every 2 ms over a fresh ``Client``.

Four configurations, each its own stack, all running side by side; each round kills
every stack's core once, one at a time (rotating order), so all share the machine's
load; N rounds (20 by default), and no stack is killed within 1.2 s of its last restart:

- the defaults: Sensorium's ``supervisor.backoff_initial_s`` (0.1 s, jitter 0.25)
  against Circus's ``check_delay`` 1 s (circusd notices a dead child by polling every
  ``check_delay``, not on SIGCHLD). Sensorium's supervisor spawns the new core as the
  backoff begins and holds it, imported and nothing else, until the backoff ends;
- each at its quickest: ``backoff_initial_s`` 0.001 (the config only requires > 0)
  against ``check_delay`` 0.05.

Both Sensorium stacks set ``supervisor.burst_window_s`` 1 s (default 10 s) so that
each kill is an isolated crash: inside the default window consecutive kills measure the
exponential backoff (0.1, 0.2, 0.4 … s) and the fifth parks core in ``failed`` for an
operator, by design. The first backoff step, which is what is measured, is the default's.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _harness import PYTHON, BenchError, emit, machine, parse_args, row
from _peers import INSTALL_HINT, peer_python

from sensorium.client import Client, SensoriumError
from sensorium.client.endpoint import core_endpoint
from sensorium.shared.config import SupervisorConfig

BENCH = "restart after kill -9 of core"
KILLS = 20
SETTLE_S = 1.2
STARTUP_TIMEOUT_S = 30.0
RESTART_TIMEOUT_S = 20.0
PROBE_SLEEP_S = 0.002
STOP_TIMEOUT_S = 15.0
MODULES = {
    "connector": "sensorium.connectors.os",
    "core": "sensorium.core",
    "poller": "sensorium.poller",
}


DEFAULT_BACKOFF_S = SupervisorConfig().backoff_initial_s


@dataclass(frozen=True)
class Mode:
    key: str
    runner: str  # "supervisor" or "circus"
    label: str
    setting: float  # backoff_initial_s or check_delay


MODES = (
    Mode(
        "sup-default",
        "supervisor",
        f"sensorium supervisor, backoff_initial_s {DEFAULT_BACKOFF_S:g} (default)",
        DEFAULT_BACKOFF_S,
    ),
    Mode("circus-default", "circus", "circus, check_delay 1.0 (default)", 1.0),
    Mode("sup-fast", "supervisor", "sensorium supervisor, backoff_initial_s 0.001", 0.001),
    Mode("circus-fast", "circus", "circus, check_delay 0.05", 0.05),
)
# (sensorium mode, circus mode, what the pair is)
PAIRS = (("sup-default", "circus-default", "defaults"), ("sup-fast", "circus-fast", "quickest"))


@dataclass
class Stack:
    work: Path
    state_dir: Path
    root: subprocess.Popen[bytes] | None = None
    seen: dict[int, psutil.Process] = field(default_factory=dict)

    @property
    def socket_path(self) -> str:
        endpoint = core_endpoint(None, str(self.state_dir))
        if not endpoint.startswith("ipc://"):
            raise BenchError(f"core endpoint {endpoint} is not ipc://")
        return endpoint[len("ipc://") :]

    def children(self) -> list[psutil.Process]:
        """Every descendant of the runner, remembered so that cleanup can find them."""
        if self.root is None:
            return []
        try:
            kids = psutil.Process(self.root.pid).children(recursive=True)
        except psutil.Error:
            return []
        for kid in kids:
            self.seen.setdefault(kid.pid, kid)
        return kids

    def core(self) -> psutil.Process | None:
        for kid in self.children():
            try:
                if MODULES["core"] in kid.cmdline():
                    return kid
            except psutil.Error:
                continue
        return None


def _node_config(state_dir: Path, backoff_initial_s: float) -> None:
    """The same node.json under both runners (circus ignores the supervisor section)."""
    config = state_dir / "config"
    config.mkdir(parents=True, exist_ok=True)
    node = {"supervisor": {"backoff_initial_s": backoff_initial_s, "burst_window_s": 1.0}}
    (config / "node.json").write_text(json.dumps(node))


def _circus_ini(stack: Stack, check_delay: float) -> Path:
    lines = [
        "[circus]",
        f"endpoint = ipc://{stack.work}/circus-control.sock",
        f"pubsub_endpoint = ipc://{stack.work}/circus-pubsub.sock",
        f"check_delay = {check_delay}",
        "statsd = False",
        "",
    ]
    for name, module in MODULES.items():
        lines += [
            f"[watcher:{name}]",
            f"cmd = {PYTHON} -m {module} --state-dir {stack.state_dir}",
            "numprocesses = 1",
            "copy_env = True",
            "stdout_stream.class = FileStream",
            f"stdout_stream.filename = {stack.work}/{name}.out",
            "stderr_stream.class = FileStream",
            f"stderr_stream.filename = {stack.work}/{name}.out",
            "",
        ]
    path = stack.work / "circus.ini"
    path.write_text("\n".join(lines))
    return path


def start(mode: Mode, peer: str | None) -> Stack:
    work = Path(tempfile.mkdtemp(prefix="sb-restart-", dir="/tmp"))
    stack = Stack(work=work, state_dir=work / "state")
    _node_config(
        stack.state_dir, mode.setting if mode.runner == "supervisor" else DEFAULT_BACKOFF_S
    )
    if mode.runner == "supervisor":
        cmd = [PYTHON, "-m", "sensorium.supervisor", "--state-dir", str(stack.state_dir)]
    else:
        assert peer is not None
        cmd = [peer, "-m", "circus.circusd", str(_circus_ini(stack, mode.setting))]
    with (work / "runner.out").open("wb") as out:
        stack.root = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    return stack


def _diagnose(stack: Stack) -> str:
    parts = []
    for out in sorted(stack.work.glob("*.out")) + sorted(stack.state_dir.glob("logs/*")):
        try:
            tail = out.read_text(errors="replace").splitlines()[-8:]
        except OSError:
            continue
        parts.append(f"--- {out.name}:\n" + "\n".join(tail))
    return "\n".join(parts)


def _listening(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError:
            return False
        return True


def wait_serving(stack: Stack, old_instance: str | None, timeout_s: float) -> str:
    """Probe until a core other than ``old_instance`` serves; return its instance id."""
    deadline = time.monotonic() + timeout_s
    path = stack.socket_path
    while time.monotonic() < deadline:
        if stack.root is not None and stack.root.poll() is not None:
            raise BenchError(f"the runner exited ({stack.root.returncode})\n" + _diagnose(stack))
        if not _listening(path):
            time.sleep(PROBE_SLEEP_S)
            continue
        with Client(state_dir=str(stack.state_dir), connect_timeout_s=1.0) as client:
            while time.monotonic() < deadline:
                try:
                    health = client.health()
                except SensoriumError:
                    break  # listening but not answering yet (or gone again): start over
                conn = health.connector
                if health.instance_id != old_instance and conn is not None and conn.actions > 0:
                    return health.instance_id
                time.sleep(PROBE_SLEEP_S)
    raise BenchError(f"core did not serve within {timeout_s:.0f} s\n" + _diagnose(stack))


def _gone(proc: psutil.Process, timeout_s: float) -> None:
    """Until the killed process is dead: reaped, or a zombie with no thread left. (Its
    main thread turns zombie before the others have exited and closed the shared fds, so
    the old listening socket may still accept; a probe connected to it would then sit in
    ZMQ's reconnect back-off.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if (
                proc.status() == psutil.STATUS_ZOMBIE
                and len(os.listdir(f"/proc/{proc.pid}/task")) <= 1
            ):
                return
        except (psutil.NoSuchProcess, FileNotFoundError):
            return
        time.sleep(0.0005)
    raise BenchError(f"pid {proc.pid} still alive {timeout_s} s after SIGKILL")


def kill_once(stack: Stack, instance: str) -> tuple[int, str]:
    """SIGKILL core; the time until a new core serves, and that core's instance id."""
    victim = stack.core()
    if victim is None:
        raise BenchError("no sensorium.core among the runner's children\n" + _diagnose(stack))
    t0 = time.perf_counter_ns()
    os.kill(victim.pid, signal.SIGKILL)
    _gone(victim, 5.0)
    instance = wait_serving(stack, instance, RESTART_TIMEOUT_S)
    elapsed = time.perf_counter_ns() - t0
    stack.children()  # remember the new pids for cleanup
    return elapsed, instance


def kill_rounds(stacks: dict[str, Stack], n: int) -> dict[str, list[int]]:
    """All stacks run side by side; each round kills each one's core once, one at a time,
    in a rotating order, so all see the same machine and none is killed within SETTLE_S
    of its last restart."""
    instance = {key: wait_serving(st, None, STARTUP_TIMEOUT_S) for key, st in stacks.items()}
    served = dict.fromkeys(stacks, time.monotonic())
    samples: dict[str, list[int]] = {key: [] for key in stacks}
    keys = list(stacks)
    for i in range(n):
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
            time.sleep(max(0.0, served[key] + SETTLE_S - time.monotonic()))
            elapsed, instance[key] = kill_once(stacks[key], instance[key])
            served[key] = time.monotonic()
            samples[key].append(elapsed)
    return samples


def stop(stacks: Sequence[Stack]) -> None:
    """SIGTERM to every runner (each stops its children), then kill anything left, by pid."""
    for stack in stacks:
        stack.children()
        if stack.root is not None and stack.root.poll() is None:
            stack.root.terminate()
    for stack in stacks:
        if stack.root is None:
            continue
        try:
            stack.root.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stack.root.kill()
            stack.root.wait(timeout=5)
    left = [proc for stack in stacks for proc in stack.seen.values()]
    for proc in left:
        try:
            if proc.is_running():  # also checks the create time: never a recycled pid
                proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=5)
    for stack in stacks:
        shutil.rmtree(stack.work, ignore_errors=True)


def _ms(samples: Sequence[int], q: float) -> float:
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1] / 1e6


def run(kills: int = KILLS) -> dict[str, Any]:
    m = machine()  # first, so the load average is not our own
    peer = peer_python("circus")
    stacks: dict[str, Stack] = {}
    try:
        for mode in MODES:
            if mode.runner == "supervisor" or peer is not None:
                stacks[mode.key] = start(mode, peer)
        samples = kill_rounds(stacks, kills)
    finally:
        stop(list(stacks.values()))
    stats = {
        key: {"n": len(s), "median_ms": _ms(s, 50), "p90_ms": _ms(s, 90), "max_ms": _ms(s, 100)}
        for key, s in samples.items()
    }
    modes = {mode.key: mode for mode in MODES}
    rows = []
    for sup, circ, what in PAIRS:
        s, c = stats[sup], stats.get(circ)
        for q in ("median", "p90"):
            rows.append(
                row(
                    BENCH,
                    f"{q}, {what}: {modes[sup].label.removeprefix('sensorium supervisor, ')}",
                    s[f"{q}_ms"],
                    c[f"{q}_ms"] if c else None,
                    unit="ms",
                    peer_name=modes[circ].label,
                )
            )
    notes = [
        f"restart: {kills} SIGKILLs of core per configuration, the four stacks side by side "
        f"and killed in turn, each ≥ {SETTLE_S} s after its last restart; time until a new "
        "core answers health with a connected connector (same probe for both runners); "
        "supervisor.burst_window_s 1 s so each kill is an isolated crash (see restart_peer.py)",
        "restart: "
        + "; ".join(
            f"{modes[k].label} median {v['median_ms']:.0f} ms, max {v['max_ms']:.0f} ms"
            for k, v in stats.items()
        ),
    ]
    if peer is None:
        notes.append(f"restart: circus not found, its column is empty: {INSTALL_HINT}")
    return {
        "name": "restart_peer",
        "machine": m,
        "stats_ms": stats,
        "modes": {mode.key: mode.label for mode in MODES},
        "rows": rows,
        "notes": notes,
    }


def main() -> None:
    args = parse_args(
        __doc__,
        lambda p: p.add_argument(
            "--kills", type=int, default=KILLS, help="kills per configuration"
        ),
    )
    emit(run(args.kills), args.json)


if __name__ == "__main__":
    main()
