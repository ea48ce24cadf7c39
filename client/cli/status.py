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
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import psutil
import zmq

from sensorium.deploy import units as unit_files
from sensorium.shared import rolelock
from sensorium.shared.config import (
    NodeConfig,
    connector_endpoint,
    core_endpoint,
    load_node_config,
    supervisor_endpoint,
)
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.rpc.server import PROBE, ProbeReply, probe_reply
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.supervisor_api import (
    Ack,
    SupervisorRestart,
    SupervisorResume,
    SupervisorStatus,
    SupervisorStatusReply,
    SupervisorStop,
)

RESUME_HELP = "Restart a process the supervisor (or systemd) marked failed."
STOP_HELP = "Stop the node: the supervisor, the systemd units, or processes started by hand."
RESTART_HELP = "Restart one process (to load an edited, re-signed catalog, say); not a failure."

ROLES = ("core", "connector", "poller")
# An orderly stop: core drains while the connector still runs what it sent.
STOP_ORDER = (("core", "poller"), ("connector",))
UNIT_OF = {p.log_name: p.unit for p in unit_files.PROCESSES}
PROBE_TIMEOUT_S = 1.0
SYSTEMCTL_TIMEOUT_S = 5.0
HAND_STOP_TIMEOUT_S = 30.0


def endpoint_of(role: str, cfg: NodeConfig, paths: StatePaths) -> str:
    if role == "core":
        return core_endpoint(cfg, paths)
    if role == "connector":
        return connector_endpoint(cfg, paths)
    return paths.ipc("poller")


def probe(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeReply | None:
    """Ask the process serving ``endpoint`` who it is; None when nobody answers."""
    if not endpoint.startswith("ipc://"):
        return None  # a CURVE handshake would need a client key; the lock must do
    if not Path(endpoint[len("ipc://") :]).exists():
        return None
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send(PROBE, flags=zmq.NOBLOCK)
        if not sock.poll(int(timeout_s * 1000)):
            return None
        return probe_reply(sock.recv())
    except zmq.ZMQError:
        return None
    finally:
        sock.close(linger=0)


# -- systemd ------------------------------------------------------------------


@dataclass
class Manager:
    """A systemd manager (system or user) that has Sensorium's units loaded."""

    user: bool
    units: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "user" if self.user else "system"

    def argv(self, *args: str) -> list[str]:
        return ["systemctl", *(["--user"] if self.user else []), *args]

    def command(self, *args: str) -> str:
        """The exact command an operator would type (sudo for the system manager)."""
        prefix = "sudo " if not self.user and os.geteuid() != 0 else ""
        return prefix + shlex.join(self.argv(*args))

    def state(self, role: str) -> str | None:
        props = self.units.get(UNIT_OF[role])
        if props is None:
            return None
        return f"{props.get('ActiveState', '?')}/{props.get('SubState', '?')}"

    def main_pid(self, role: str) -> int | None:
        text = self.units.get(UNIT_OF[role], {}).get("MainPID", "0")
        return int(text) if text.isdigit() and text != "0" else None

    def run(self, *args: str) -> int:
        """Act through systemctl when this user may; else print the exact command."""
        if not self.user and os.geteuid() != 0:
            print(f"the node runs under systemd's system manager; run:\n  {self.command(*args)}")
            return 1
        print(f"$ {shlex.join(self.argv(*args))}")
        try:
            res = subprocess.run(self.argv(*args), stdin=subprocess.DEVNULL, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"sensorium: systemctl failed ({exc}); run it yourself:\n  {self.command(*args)}")
            return 1
        return 0 if res.returncode == 0 else 1


def systemd_managers() -> list[Manager]:
    """The managers (system, then the user's) with Sensorium's units loaded; none when
    systemctl is missing or no systemd runs."""
    found = []
    names = [*UNIT_OF.values(), unit_files.TARGET]
    for user in (False, True):
        argv = ["systemctl", *(["--user"] if user else []), "show"]
        argv += ["--property=Id,LoadState,ActiveState,SubState,MainPID", *names]
        try:
            res = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=SYSTEMCTL_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if res.returncode != 0:
            continue
        manager = Manager(user)
        for block in res.stdout.split("\n\n"):
            props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            if props.get("LoadState") == "loaded" and props.get("Id"):
                manager.units[props["Id"]] = props
        if any(name in manager.units for name in UNIT_OF.values()):
            found.append(manager)
    return found


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


@dataclass
class Node:
    paths: StatePaths
    cfg: NodeConfig
    supervisor: SupervisorStatusReply | None
    holders: dict[str, int | None]
    managers: list[Manager]

    @property
    def running(self) -> bool:
        return self.supervisor is not None or any(self.holders.values())

    def manager(self) -> Manager | None:
        """The systemd manager that runs this node, if one does: the one whose unit's
        MainPID holds a role's lock, else (nothing runs) the first with the units."""
        for m in self.managers:
            if any(pid and m.main_pid(role) == pid for role, pid in self.holders.items()):
                return m
        if not any(self.holders.values()) and self.managers:
            return self.managers[0]
        return None

    def mode(self) -> str:
        if self.supervisor is not None:
            return f"supervisor pid {self.supervisor.pid}, up since {self.supervisor.started_at}"
        m = self.manager()
        if m is not None and any(self.holders.values()):
            return f"systemd {m.name} units"
        if any(self.holders.values()):
            return "processes started by hand (no supervisor, no systemd unit)"
        return "not running"


def locate(state_dir: str | None) -> Node:
    paths = StatePaths(resolve_state_dir(state_dir))
    cfg = load_node_config(paths)
    return Node(
        paths,
        cfg,
        _supervisor_status(paths, cfg),
        {role: rolelock.holder(paths, role) for role in ROLES},
        systemd_managers(),
    )


def _supervisor_client(paths: StatePaths, cfg: NodeConfig) -> SyncRpcClient:
    return SyncRpcClient(supervisor_endpoint(cfg, paths), name="supervisor", connect_timeout_s=1.0)


def _supervisor_status(paths: StatePaths, cfg: NodeConfig) -> SupervisorStatusReply | None:
    if rolelock.holder(paths, "supervisor") is None:
        return None
    try:
        with _supervisor_client(paths, cfg) as client:
            return client.call(SupervisorStatus(request_id=new_id()), SupervisorStatusReply, 5.0)
    except CodedError:
        return None


def rows(node: Node) -> list[Row]:
    children = {c.name: c for c in node.supervisor.children} if node.supervisor else {}
    manager = node.manager()
    out = []
    for role in ROLES:
        pid = node.holders[role]
        answer = probe(endpoint_of(role, node.cfg, node.paths)) if pid else None
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
        with _supervisor_client(node.paths, node.cfg) as client:
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


def configure_stop(parser: argparse.ArgumentParser) -> None:
    pass


def run_stop(args: argparse.Namespace) -> int:
    node = locate(args.state_dir)
    if node.supervisor is not None:
        with _supervisor_client(node.paths, node.cfg) as client:
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


def run_restart(args: argparse.Namespace) -> int:
    node = locate(args.state_dir)
    if node.supervisor is not None:
        with _supervisor_client(node.paths, node.cfg) as client:
            ack = client.call(
                SupervisorRestart(request_id=new_id(), process=args.process), Ack, 5.0
            )
        print(ack.message)
        return 0 if ack.ok else 1
    m = node.manager()
    if m is not None and (node.running or m.units):
        return m.run("restart", UNIT_OF[args.process])
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
