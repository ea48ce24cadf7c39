"""Show each process of the node: state, pid, uptime, restarts, memory, and whether it answers.

Works whoever started the processes: `sensorium up`, systemd (system or user units), or
by hand. Each process is asked itself, on the socket it serves (core on core.sock, the
connector on connector.sock, the poller on poller.sock); its pid comes from the lock it
holds on run/<process>.lock; the supervisor adds its state and restart counts, and
systemd units (when installed) their ActiveState.

Exit status 0 when every process is ready and answers, 1 otherwise, 3 when nothing of the
node runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from dataclasses import dataclass

import msgspec
import psutil

from sensorium.client.cli import restarted
from sensorium.client.cli.node import (
    ROLES,
    UNIT_OF,
    Node,
    endpoint_of,
    locate,
    probe_all,
    supervisor_client,
)
from sensorium.deploy import units as unit_files
from sensorium.shared import rolelock
from sensorium.shared.ids import new_id
from sensorium.shared.wire.supervisor_api import (
    Ack,
    SupervisorRestart,
    SupervisorResume,
    SupervisorStop,
)

RESUME_HELP = "Restart a process the supervisor (or systemd) marked failed."
STOP_HELP = "Stop the node: the supervisor, the systemd units, or processes started by hand."
RESTART_HELP = "Restart one process (to load an edited, re-signed catalog, say); not a failure."

# An orderly stop: core drains while the connector still runs what it sent.
STOP_ORDER = (("core", "poller"), ("connector",))
HAND_STOP_TIMEOUT_S = 30.0


# -- the node as it is now ----------------------------------------------------


@dataclass
class Row:
    name: str
    state: str
    pid: int | None = None
    uptime_s: float | None = None
    restarts: int | None = None
    rss_bytes: int | None = None
    answers: bool | None = None
    inflight: int | None = None
    unit: str | None = None
    note: str = ""


def rows(node: Node) -> list[Row]:
    children = {c.name: c for c in node.supervisor.children} if node.supervisor else {}
    manager = node.manager()
    out = []
    asked = [r for r in ROLES if node.holders[r]]
    answers = dict(
        zip(asked, probe_all([endpoint_of(r, node.cfg, node.paths) for r in asked]), strict=True)
    )
    for role in ROLES:
        pid = node.holders[role]
        answer = answers.get(role)
        row = Row(role, "stopped", pid=pid)
        child = children.get(role)
        if child is not None:
            row.state, row.restarts = child.state, child.restarts
            row.pid = child.pid or pid
            row.note = child.last_exit or child.status_text or ""
        elif pid:
            row.state = "ready" if answer is not None else "unreachable"
            if answer is not None and answer.closing:
                row.state = "stopping"
        if answer is not None:
            row.answers, row.inflight = answer.pid == row.pid, answer.inflight
        elif row.pid:
            row.answers = False
            if not row.note:
                row.note = f"no answer on {endpoint_of(role, node.cfg, node.paths)}"
        if row.pid:
            try:
                proc = psutil.Process(row.pid)
                with proc.oneshot():
                    row.uptime_s = max(0.0, time.time() - proc.create_time())
                    row.rss_bytes = proc.memory_info().rss
            except psutil.Error:
                pass
        if manager is not None:
            row.unit = manager.state(role)
        out.append(row)
    return out


def _mib(n: int | None) -> str:
    return f"{n / 1048576:.1f} MiB" if n else "-"


def _uptime(s: float | None) -> str:
    if s is None:
        return "-"
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def _answers(row: Row) -> str:
    return "-" if row.answers is None else "yes" if row.answers else "NO"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def _start_hint(node: Node) -> str:
    m = node.manager()
    if m is not None:
        return f"`{m.command('start', unit_files.TARGET)}` (systemd {m.name} units are installed)"
    return "`sensorium up`"


def run(args: argparse.Namespace) -> int:
    node = locate(args.state_dir)
    table = rows(node)
    if args.json:
        print(
            msgspec.json.encode(
                {
                    "state_dir": str(node.paths.root),
                    "mode": node.mode(),
                    "supervisor": node.supervisor,
                    "processes": [r.__dict__ for r in table],
                }
            ).decode()
        )
    else:
        print(f"node {node.paths.root}: {node.mode()}")
        show_units = any(r.unit for r in table)
        print(
            f"{'PROCESS':<10} {'STATE':<11} {'PID':>7} {'UPTIME':>8} {'RESTARTS':>8} "
            f"{'RSS':>10} {'ANSWERS':>7}"
            + (f"  {'UNIT':<16}" if show_units else "")
            + "  LAST EXIT / STATUS"
        )
        for r in table:
            restarts = "-" if r.restarts is None else str(r.restarts)
            unit = f"  {r.unit or '-':<16}" if show_units else ""
            print(
                f"{r.name:<10} {r.state:<11} {r.pid or '-':>7} {_uptime(r.uptime_s):>8} "
                f"{restarts:>8} {_mib(r.rss_bytes):>10} {_answers(r):>7}{unit}  {r.note}"
            )
    if not node.running:
        if not args.json:
            print(f"sensorium: nothing of this node runs; start it with {_start_hint(node)}")
        return 3
    return 0 if all(r.state == "ready" and r.answers for r in table) else 1


# -- resume, stop, restart ------------------------------------------------------


def _not_running(node: Node, what: str) -> int:
    print(f"sensorium: nothing of the node at {node.paths.root} runs; {what}")
    return 1


def _by_hand(node: Node, role: str) -> str:
    return (
        f"{role} (pid {node.holders[role]}) was started by hand: no supervisor and no "
        "systemd unit runs it, so nothing here can start it again"
    )


def configure_resume(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("process", choices=list(ROLES))


def run_resume(args: argparse.Namespace) -> int:
    node = locate(args.state_dir)
    if node.supervisor is not None:
        with supervisor_client(node.paths, node.cfg) as client:
            ack = client.call(SupervisorResume(request_id=new_id(), process=args.process), Ack, 5.0)
        print(ack.message)
        return 0 if ack.ok else 1
    m = node.manager()
    if m is not None:
        unit = UNIT_OF[args.process]
        if m.run("reset-failed", unit) != 0:
            return 1
        return m.run("start", unit)
    if node.running:
        print(f"sensorium: {args.process} has no supervisor; start it the way the others were")
        return 1
    return _not_running(node, f"start it with {_start_hint(node)}")


def _after_restart(
    node: Node, args: argparse.Namespace, code: int, before: tuple[str | None, str | None]
) -> int:
    """The next command finds it serving: a restart returns once it does."""
    if code != 0 or args.no_wait:
        return code
    problem = restarted.wait_restarted(node, args.process, before)
    if problem is not None:
        print(f"sensorium: {problem}")
        return 1
    print(f"{args.process} serving again")
    return 0


def configure_stop(parser: argparse.ArgumentParser) -> None:
    pass


def run_stop(args: argparse.Namespace) -> int:
    node = locate(args.state_dir)
    if node.supervisor is not None:
        with supervisor_client(node.paths, node.cfg) as client:
            ack = client.call(SupervisorStop(request_id=new_id()), Ack, 5.0)
        print(ack.message)
        return 0
    m = node.manager()
    if m is not None and node.running:
        # One transaction: systemctl waits for every job, and After= orders the stops
        # (poller, core, then the connector), so core drains first.
        names = [unit_files.TARGET, *(UNIT_OF[r] for step in STOP_ORDER for r in step)]
        return m.run("stop", *names)
    if not node.running:
        return _not_running(node, "nothing to stop")
    return _stop_by_hand(node)


def _stop_by_hand(node: Node) -> int:
    """SIGTERM each process in the drain order, waiting for each step to let go of its
    locks before the next, as the supervisor does."""
    for step in STOP_ORDER:
        pids = {role: node.holders[role] for role in step if node.holders[role]}
        for role, pid in pids.items():
            assert pid is not None
            try:
                os.kill(pid, signal.SIGTERM)
                print(f"{role} (pid {pid}): SIGTERM")
            except ProcessLookupError:
                pass
            except PermissionError:
                print(f"sensorium: may not signal {role} (pid {pid}); run: kill -TERM {pid}")
                return 1
        deadline = time.monotonic() + HAND_STOP_TIMEOUT_S
        while time.monotonic() < deadline and any(
            rolelock.holder(node.paths, role) for role in pids
        ):
            time.sleep(0.05)
        left = [role for role in pids if rolelock.holder(node.paths, role)]
        if left:
            print(f"sensorium: {', '.join(left)} did not stop in {HAND_STOP_TIMEOUT_S:.0f}s")
            return 1
    print("stopped")
    return 0


def configure_restart(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("process", choices=list(ROLES))
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="return at once instead of when the process serves again",
    )


def run_restart(args: argparse.Namespace) -> int:
    node = locate(args.state_dir)
    before = restarted.state_before(node, args.process)
    if node.supervisor is not None:
        with supervisor_client(node.paths, node.cfg) as client:
            ack = client.call(
                SupervisorRestart(request_id=new_id(), process=args.process), Ack, 5.0
            )
        print(ack.message)
        return _after_restart(node, args, 0 if ack.ok else 1, before)
    m = node.manager()
    if m is not None and (node.running or m.units):
        return _after_restart(node, args, m.run("restart", UNIT_OF[args.process]), before)
    if node.holders[args.process]:
        print(
            f"sensorium: {_by_hand(node, args.process)}; stop it (kill -TERM "
            f"{node.holders[args.process]}) and start it again the way you did"
        )
        return 1
    if node.running:
        print(
            f"sensorium: {args.process} is not running, and no supervisor or systemd unit "
            "manages this node; start it the way the others were"
        )
        return 1
    return _not_running(node, f"start it with {_start_hint(node)}")
