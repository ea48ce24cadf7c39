"""The test harness: declarations for test programs, and a running `sensorium up`."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from sensorium.client import Client
from sensorium.shared.config import load_node_config, supervisor_endpoint
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.supervisor_api import SupervisorStatus, SupervisorStatusReply

PYTHON = sys.executable


def _world_readable_programs() -> Path:
    """A copy of tests/programs any uid can read: actions run as an unprivileged uid,
    and a checkout under /root (mode 0700) is not reachable for it."""
    src = Path(__file__).parent / "programs"
    # Not under /tmp: every action sees its own empty /tmp.
    dest = Path(tempfile.mkdtemp(prefix="sensorium-programs-", dir="/var/tmp"))
    dest.chmod(0o755)
    for f in src.glob("*.py"):
        shutil.copy(f, dest / f.name)
        (dest / f.name).chmod(0o755)
    atexit.register(shutil.rmtree, dest, True)
    return dest


PROGRAMS = _world_readable_programs()
# The interpreter actions run: the system one, which every uid can execute (a venv's
# may sit in an unreachable home); the programs use the standard library only.
ACTION_PYTHON = next(
    (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)),
    PYTHON,
)
SENSORIUM = [PYTHON, "-m", "sensorium.client.cli.main"]


def program(name: str) -> str:
    """A program of PROGRAMS by name, or any program by absolute path."""
    return name if name.startswith("/") else str(PROGRAMS / name)


def python_action(
    action_id: str,
    script: str,
    argv: list[str] | None = None,
    properties: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A C1 declaration running one of tests/programs with this interpreter."""
    props = properties or {}
    decl: dict[str, Any] = {
        "action_id": action_id,
        "class": "read-only-spawn",
        "group": "test",
        "executable": {
            "kind": "binary",
            "path": ACTION_PYTHON,
            "argv_shape": ["python3", program(script), *(argv or [])],
        },
        "parameters_schema": {
            "type": "object",
            "properties": props,
            "required": sorted(props),
            "additionalProperties": False,
        },
        "default_timeout_ms": 10_000,
        "max_timeout_ms": 60_000,
    }
    decl.update(extra)
    return decl


DEFER_PROFILE = {"preferred_retry_after_seconds": 1, "preferred_max_ttl_seconds": 120}


def deferrable_sleep(action_id: str, **extra: Any) -> dict[str, Any]:
    """tests/programs/sleep.py as an action that may run deferred (``either`` by default)."""
    decl: dict[str, Any] = {
        "execution_mode_support": "either",
        "deferred_profile": DEFER_PROFILE,
        **extra,
    }
    return python_action(
        action_id, "sleep.py", ["{{seconds}}"], {"seconds": {"type": "number"}}, **decl
    )


def write_dropin(paths: StatePaths, name: str, actions: list[dict[str, Any]]) -> Path:
    d = paths.connectors_config / "sensorium-os.d"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.json"
    path.write_text(json.dumps({"schema": "sensorium-os-config.v1", "action_catalog": actions}))
    return path


TEST_ACTIONS = [
    python_action(
        "test.echo-args", "echo_args.py", ["--", "{{value}}"], {"value": {"type": "string"}}
    ),
    python_action("test.inspect", "inspect_self.py", result_contract={"stdout_format": "json"}),
    python_action(
        "test.flood",
        "flood.py",
        ["{{bytes}}"],
        {"bytes": {"type": "integer"}},
        limits={"stdout_max_bytes": 4096, "stderr_max_bytes": 4096},
    ),
    python_action("test.sleep", "sleep.py", ["{{seconds}}"], {"seconds": {"type": "number"}}),
    python_action(
        "test.grandchild",
        "grandchild.py",
        ["{{mode}}"],
        {"mode": {"type": "string", "enum": ["hold", "exit"]}},
    ),
    python_action(
        "test.json",
        "emit.py",
        ["{{text}}"],
        {"text": {"type": "string"}},
        result_contract={
            "stdout_format": "json",
            "result_pointer_fields": ["a"],
            "pointer_fields": ["a"],
        },
    ),
    python_action("test.exit", "exit_with.py", ["{{code}}"], {"code": {"type": "integer"}}),
]


class Stack:
    """A running `sensorium up` on a private state directory."""

    def __init__(self, paths: StatePaths, proc: subprocess.Popen[bytes]) -> None:
        self.paths = paths
        self.proc = proc

    def __repr__(self) -> str:
        return f"<Stack {self.paths.root} supervisor={self.proc.pid}>"

    def status(self) -> SupervisorStatusReply:
        endpoint = supervisor_endpoint(load_node_config(self.paths), self.paths)
        with SyncRpcClient(endpoint, name="supervisor", connect_timeout_s=2.0) as c:
            return c.call(SupervisorStatus(request_id=new_id()), SupervisorStatusReply, 5.0)

    def pids(self) -> dict[str, int | None]:
        return {c.name: c.pid for c in self.status().children}

    def states(self) -> dict[str, str]:
        return {c.name: c.state for c in self.status().children}

    def client(self) -> Client:
        return Client(state_dir=str(self.paths.root))

    def wait_ready(self, timeout_s: float = 30.0, *, actions: bool = True) -> None:
        """Every process READY and (by default) core resolving the connector's catalog."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"supervisor exited with {self.proc.returncode}")
            try:
                states = self.states()
                last = states
                if all(s == "ready" for s in states.values()):
                    if not actions:
                        return
                    with self.client() as c:
                        health = c.health()
                    last = health
                    if (
                        health.connector
                        and health.connector.connected
                        and health.connector.actions > 0
                    ):
                        return
            except (CodedError, Exception) as exc:  # not up yet
                last = exc
            time.sleep(0.05)
        raise AssertionError(f"stack not ready in {timeout_s}s: {last!r}")

    def wait_replaced(self, name: str, old_pid: int | None, timeout_s: float = 30.0) -> int:
        """Wait until ``name`` runs under a new pid and the stack is ready again."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self.pids().get(name)
            if pid is not None and pid != old_pid:
                self.wait_ready(max(deadline - time.monotonic(), 0.1))
                return pid
            time.sleep(0.02)
        raise AssertionError(f"{name} was not restarted within {timeout_s}s")

    def action_pid(self, script: str, timeout_s: float = 10.0) -> int:
        """The host pid of a running test action, found among the connector's descendants
        (the zygote, the sandbox's monitor and init stand between them)."""
        deadline = time.monotonic() + timeout_s
        connector = psutil.Process(self.pids()["connector"])
        while time.monotonic() < deadline:
            for child in connector.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if script in " ".join(child.cmdline()):
                        return child.pid
            time.sleep(0.02)
        raise AssertionError(f"{script} never started")

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SENSORIUM, "--state-dir", str(self.paths.root), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def stop(self) -> None:
        survivors = self.tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        for p in survivors:
            with contextlib.suppress(psutil.Error):
                p.kill()


OPERATOR = "did:test:operator"


def sign_catalog(paths: StatePaths) -> None:
    """What an operator does after editing: make a trusted key once, sign the catalog
    (the functions behind `sensorium keys new --trust` and `sensorium catalog sign`)."""
    from sensorium.connectors.os import authorization as auth
    from sensorium.connectors.os import catalog as catalog_mod
    from sensorium.shared.keys import new_operator_key, trust_signer

    if not catalog_mod.load(paths, materialize_defaults=False).valid:
        return  # an invalid catalog cannot be signed; the test wants to see the refusal
    pair, _path = new_operator_key(paths, OPERATOR)
    trust_signer(paths, pair)
    auth.sign_effective(paths, pair)


@contextlib.contextmanager
def running_stack(
    actions: list[dict[str, Any]],
    dropins: dict[str, dict[str, Any]] | None = None,
    node: dict[str, Any] | None = None,
) -> Iterator[Stack]:
    """A ready stack in a fresh state dir with ``actions`` (and extra connector drop-ins,
    signed with the rest), stopped and removed afterwards (kept when KEEP is set)."""
    # Short, because AF_UNIX socket paths are limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    paths = StatePaths(root)
    for name, doc in (dropins or {}).items():
        d = paths.connectors_config / "sensorium-os.d"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.json").write_text(json.dumps(doc))
    s = start_stack(paths, actions, node)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()
        if not os.environ.get("KEEP"):
            shutil.rmtree(root, ignore_errors=True)


def start_stack(
    paths: StatePaths,
    actions: list[dict[str, Any]] | None = None,
    node: dict[str, Any] | None = None,
    *,
    sign: bool = True,
) -> Stack:
    paths.ensure()
    if actions:
        write_dropin(paths, "50-tests", actions)
    if node:
        paths.node_config.write_text(json.dumps(node))
    if actions and sign:
        sign_catalog(paths)
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen(
        [*SENSORIUM, "up", "--quiet", "--state-dir", str(paths.root)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    return Stack(paths, proc)


TEST_ACTIONS += [
    python_action("test.stubborn", "stubborn.py", ["{{seconds}}"], {"seconds": {"type": "number"}}),
    python_action("test.escape", "escape.py"),
    python_action(
        "test.binary",
        "binary.py",
        ["{{bytes}}"],
        {"bytes": {"type": "integer"}},
        limits={"stdout_max_bytes": 1048576, "stderr_max_bytes": 1048576},
    ),
]


def none_running(marker: str, within_s: float) -> bool:
    """True once no live process on the host has ``marker`` in its command line.

    Sandboxed actions report pids of their own PID namespace, which mean nothing
    out here; their command line is what identifies them."""
    deadline = time.monotonic() + within_s
    while True:
        alive = []
        for p in psutil.process_iter(["cmdline", "status"]):
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(p.info["cmdline"] or [])
                if marker in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def gone(pid: int, within_s: float) -> bool:
    """True once ``pid`` has exited (a zombie counts) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
