"""The node as it runs now: who holds each role's lock, its supervisor, the systemd
managers with its units, and a probe of each process's socket.

``sensorium status`` shows it; ``resume``, ``stop`` and ``restart`` act through
whichever of them runs the node.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

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
from sensorium.shared.rpc.probe import PROBE, ProbeReply, probe_reply
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.supervisor_api import SupervisorStatus, SupervisorStatusReply

ROLES = ("core", "connector", "poller")
UNIT_OF = {p.log_name: p.unit for p in unit_files.PROCESSES}
# Generous: a busy machine answers late, and a late answer is still an answer.
PROBE_TIMEOUT_S = 5.0
SYSTEMCTL_TIMEOUT_S = 5.0


def endpoint_of(role: str, cfg: NodeConfig, paths: StatePaths) -> str:
    if role == "core":
        return core_endpoint(cfg, paths)
    if role == "connector":
        return connector_endpoint(cfg, paths)
    return paths.ipc("poller")


def probe(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeReply | None:
    """Ask the process serving ``endpoint`` who it is; None when nobody answers."""
    return probe_all([endpoint], timeout_s)[0]


def probe_all(endpoints: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> list[ProbeReply | None]:
    """Ask every process at once, under one deadline: a loaded machine makes each answer
    late, and asking in turn would add those delays up."""
    answers: list[ProbeReply | None] = [None] * len(endpoints)
    socks: dict[zmq.Socket[bytes], int] = {}
    poller = zmq.Poller()
    try:
        for i, endpoint in enumerate(endpoints):
            if not endpoint.startswith("ipc://"):
                continue  # a CURVE handshake would need a client key; the lock must do
            if not Path(endpoint[len("ipc://") :]).exists():
                continue
            sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
            socks[sock] = i
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.connect(endpoint)
                sock.send(PROBE, flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                continue
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        waiting = len(poller.sockets)
        while waiting and (left := deadline - time.monotonic()) > 0:
            for ready, _ in poller.poll(int(left * 1000) + 1):
                poller.unregister(ready)
                waiting -= 1
                with contextlib.suppress(zmq.ZMQError):
                    answers[socks[ready]] = probe_reply(ready.recv(flags=zmq.NOBLOCK))
    finally:
        for sock in socks:
            sock.close(linger=0)
    return answers


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


def supervisor_client(paths: StatePaths, cfg: NodeConfig) -> SyncRpcClient:
    return SyncRpcClient(supervisor_endpoint(cfg, paths), name="supervisor", connect_timeout_s=1.0)


def _supervisor_status(paths: StatePaths, cfg: NodeConfig) -> SupervisorStatusReply | None:
    if rolelock.holder(paths, "supervisor") is None:
        return None
    try:
        with supervisor_client(paths, cfg) as client:
            return client.call(SupervisorStatus(request_id=new_id()), SupervisorStatusReply, 5.0)
    except CodedError:
        return None
