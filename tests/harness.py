"""The test harness: declarations for test programs, and a running `sensorium up`."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
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
# The uid the unprivileged tests run a whole node as: no account, no home, no groups,
# nothing of root's — an ordinary user as far as the kernel can tell.
NODE_UID = 61234


def _runtime_copy() -> tuple[str, Path]:
    """A Python and a PYTHONPATH that any uid can run Sensorium from.

    The test venv's interpreter may live under /root (0700): the node of an
    unprivileged test runs the system python3 (the same minor version) with a
    world-readable copy of the venv's libraries and of this checkout's package.
    """
    import sensorium

    dest = Path(tempfile.mkdtemp(prefix="sensorium-runtime-", dir="/var/tmp"))
    atexit.register(shutil.rmtree, dest, True)
    site = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    skip = {"sensorium", "pip", "setuptools", "mypy", "mypyc", "ruff", "hypothesis", "_pytest"}
    for entry in site.iterdir():
        name = entry.name
        if name in skip or name.startswith(("__editable__", "mypy", "ruff", "pytest")):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.suffix in (".so", ".py", ".pth"):
            shutil.copy(entry, dest / name)
    source = Path(sensorium.__file__).parent
    shutil.copytree(
        source,
        dest / "sensorium",
        ignore=shutil.ignore_patterns(
            "__pycache__", ".git", ".venv", "build", "tests", "bench", "*.egg-info", ".*cache"
        ),
    )
    for d, _dirs, files in os.walk(dest):
        os.chmod(d, 0o755)
        for f in files:
            # Programs stay programs (the sandbox's compiled exec stage).
            path = os.path.join(d, f)
            os.chmod(path, 0o755 if os.stat(path).st_mode & 0o100 else 0o644)
    return ACTION_PYTHON, dest


_RUNTIME: tuple[str, Path] | None = None


def unprivileged_runtime() -> tuple[str, Path]:
    """(python, PYTHONPATH) for a node run as NODE_UID; made once per test session."""
    global _RUNTIME
    if _RUNTIME is None:
        if os.geteuid() != 0:
            raise RuntimeError("only root can start a node as another uid")
        probe = subprocess.run(
            [ACTION_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=True,
        )
        if probe.stdout.strip() != str(sys.version_info[:2]):
            raise RuntimeError(
                f"{ACTION_PYTHON} is Python {probe.stdout.strip()}, the venv's is "
                f"{sys.version_info[:2]}: compiled dependencies would not load"
            )
        _RUNTIME = _runtime_copy()
    return _RUNTIME


# Variables a node reads that this test run may have inherited (under systemd, or from
# a developer's shell): a test's node starts from none of them.
INHERITED_ENV = (
    "NOTIFY_SOCKET",
    "SENSORIUM_LOG_LEVEL",
    "SENSORIUM_STATE_DIR",
    "SENSORIUM_SUPERVISOR_PID",
    "JOURNAL_STREAM",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
)


def default_signals() -> None:
    """A preexec_fn: the signal dispositions a shell's job gets, not this run's. Under
    `nohup` SIGHUP is ignored, in a background job SIGINT and SIGQUIT; a node that
    inherited that would (rightly) behave differently."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def drop_to(uid: int) -> Any:
    """A preexec_fn that makes the child an ordinary user: ``uid``, its own group only."""

    def drop() -> None:
        default_signals()
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    return drop


def user_state_dir(uid: int = NODE_UID) -> StatePaths:
    """A state dir an ordinary user owns, outside /tmp (every action has its own /tmp,
    so only a state dir elsewhere proves the masking), with a home beside it."""
    root = Path(tempfile.mkdtemp(prefix="su-", dir="/var/tmp"))
    root.chmod(0o711)
    os.chown(root, uid, uid)
    return StatePaths(root / "s")


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

    def wait_connected(self, timeout_s: float = 30.0) -> None:
        """Core holds the connector's report (its catalog valid or not). Core's READY
        waits for it only ``limits.core_ready_wait_s``; a test that needs it waits here."""
        deadline = time.monotonic() + timeout_s
        with self.client() as c:
            while time.monotonic() < deadline:
                health = c.health()
                if health.connector and health.connector.connected:
                    return
                time.sleep(0.05)
        raise AssertionError(f"core did not reach the connector within {timeout_s}s")

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
        (the zygote and the sandbox's init stand between them)."""
        return self.action_pids(script, 1, timeout_s)[0]

    def action_pids(self, script: str, count: int, timeout_s: float = 10.0) -> list[int]:
        """Once at least ``count`` runs of a test action are live: their host pids."""
        deadline = time.monotonic() + timeout_s
        connector = psutil.Process(self.pids()["connector"])
        while time.monotonic() < deadline:
            found = []
            for child in connector.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if script in " ".join(child.cmdline()):
                        found.append(child.pid)
            if len(found) >= count:
                return found
            time.sleep(0.02)
        raise AssertionError(f"{count} runs of {script} never started")

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SENSORIUM, "--state-dir", str(self.paths.root), *args],
            # No terminal to prompt on: a command that would ask refuses instead.
            stdin=subprocess.DEVNULL,
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
    from sensorium.connectors.os.catalog import authorization as auth
    from sensorium.connectors.os.catalog import sources as catalog_mod
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
    *,
    user: int | None = None,
    confine: str | None = None,
    ready: bool = True,
    wrap: list[str] | None = None,
) -> Iterator[Stack]:
    """A ready stack in a fresh state dir with ``actions`` (and extra connector drop-ins,
    signed with the rest), stopped and removed afterwards (kept when KEEP is set).
    With ``user``, the whole node runs as that ordinary uid."""
    if user is None:
        # Short, because AF_UNIX socket paths are limited to 107 bytes.
        paths = StatePaths(Path(tempfile.mkdtemp(prefix="st-", dir="/tmp")))
        root = paths.root
    else:
        paths = user_state_dir(user)
        root = paths.root.parent
    for name, doc in (dropins or {}).items():
        d = paths.connectors_config / "sensorium-os.d"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.json").write_text(json.dumps(doc))
    s = start_stack(paths, actions, node, user=user, confine=confine, wrap=wrap)
    try:
        s.wait_ready(actions=ready)
        yield s
    finally:
        s.stop()
        if not os.environ.get("KEEP"):
            shutil.rmtree(root, ignore_errors=True)


def sensorium_command(
    user: int | None = None,
    confine: str | None = None,
    home: Path | None = None,
    wrap: list[str] | None = None,
) -> tuple[list[str], dict[str, str], Any]:
    """(argv prefix, environment, preexec_fn) that run the ``sensorium`` CLI as root or
    as the ordinary ``user``, under tests/confine.py's filter refusing ``confine``, and
    through ``wrap`` (a command prefix such as setpriv's) when given."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED_ENV}
    command, preexec = [*SENSORIUM], default_signals
    if user is not None:
        python, pythonpath = unprivileged_runtime()
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home or "/nonexistent"),
            "PYTHONPATH": str(pythonpath),
            "LANG": "C.UTF-8",
            # tests/janitor.py finds the run's processes by it.
            "SENSORIUM_TEST_RUN": os.environ.get("SENSORIUM_TEST_RUN", ""),
        }
        command, preexec = [python, "-m", "sensorium.client.cli.main"], drop_to(user)
    if confine is not None:
        wrapper = PROGRAMS / "confine.py"
        shutil.copy(Path(__file__).parent / "confine.py", wrapper)
        wrapper.chmod(0o755)
        command = [command[0], str(wrapper), confine, "--", *command]
    return [*(wrap or []), *command], env, preexec


def start_stack(
    paths: StatePaths,
    actions: list[dict[str, Any]] | None = None,
    node: dict[str, Any] | None = None,
    *,
    sign: bool = True,
    user: int | None = None,
    confine: str | None = None,
    wrap: list[str] | None = None,
) -> Stack:
    """``sensorium up`` on ``paths``; as the ordinary user ``user`` when given (the state
    dir and a home beside it are then that user's, and so are the node's processes);
    under tests/confine.py's seccomp filter refusing ``confine`` when given."""
    paths.ensure()
    if actions:
        write_dropin(paths, "50-tests", actions)
    if node:
        paths.node_config.write_text(json.dumps(node))
    if actions and sign:
        sign_catalog(paths)
    home = None
    if user is not None:
        home = paths.root.parent / "home"
        home.mkdir(mode=0o700, exist_ok=True)
        for d, _dirs, files in os.walk(paths.root.parent):
            for name in [d, *(os.path.join(d, f) for f in files)]:
                os.lchown(name, user, user)
    command, env, preexec = sensorium_command(user, confine, home, wrap)
    proc = subprocess.Popen(
        [*command, "up", "--quiet", "--state-dir", str(paths.root)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=preexec,
        cwd="/",
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


def ignoring_sigterm(pid: int, within_s: float) -> None:
    """Return once the process has set SIGTERM to ignored (its SigIgn mask says so)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as f:
            ignored = next(int(x.split()[1], 16) for x in f if x.startswith("SigIgn:"))
        if ignored & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} never ignored SIGTERM")


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


# -- fault injection: keyed load, random SIGKILLs, and what must hold afterwards -------

CHAOS_ACTIONS = [
    python_action("test.sleep", "sleep.py", ["{{seconds}}"], {"seconds": {"type": "number"}}),
    deferrable_sleep("test.defer.sleep"),
]
# The poller re-reads open operations quickly, so they end soon after each recovery.
CHAOS_NODE = {"deferred": {"min_retry_s": 0.2}}
VICTIMS = ("core", "connector", "poller", "supervisor")
TERMINAL_OPS = ("completed", "failed", "timed-out", "cancelled", "expired", "unknown")


class Answer:
    """What one keyed directive got: ``kind`` is outcome, rejected, in-doubt, retryable
    (after its retries), deferred (a handle) or other (a bug); ``bound_s`` the longest
    its call may take (attempts × their waits, pauses, and the deadline)."""

    __slots__ = ("bound_s", "code", "elapsed_s", "key", "kind", "mode", "operation_id")

    def __init__(
        self,
        mode: str,
        key: str,
        kind: str,
        code: str | None,
        elapsed_s: float,
        bound_s: float,
        operation_id: str | None = None,
    ) -> None:
        self.mode, self.key, self.kind = mode, key, kind
        self.code = None if code is None else str(code)  # a plain string, not the enum
        self.elapsed_s, self.bound_s, self.operation_id = elapsed_s, bound_s, operation_id

    def __repr__(self) -> str:
        return f"<Answer {self.mode} {self.kind} {self.code} {self.elapsed_s:.1f}s {self.key}>"


class KeyedLoad:
    """Threads sending keyed directives through the retrying ``Client`` until stopped:
    sync ``test.sleep`` (a few with bad parameters, to be refused) and async
    ``test.defer.sleep``. Every call is bounded by its reply wait, retries and deadline."""

    REPLY_S = 8.0  # each attempt's reply wait
    DEADLINE_S = 12.0  # no retry is sent after this
    RETRIES = 3

    def __init__(
        self, paths: StatePaths, seed: int, sync_threads: int = 3, async_threads: int = 1
    ) -> None:
        import random
        import threading

        self.paths = paths
        self.answers: list[Answer] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(mode, random.Random(seed + i)), daemon=True)
            for i, mode in enumerate(["sync"] * sync_threads + ["async"] * async_threads)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> list[str]:
        """Stop sending; the names of threads still stuck after the longest bound."""
        self._stop.set()
        end = time.monotonic() + self.bound_s() + 5
        for t in self._threads:
            t.join(max(0.1, end - time.monotonic()))
        return [t.name for t in self._threads if t.is_alive()]

    def bound_s(self) -> float:
        # The last attempt may start just before the deadline: connect wait + reply wait.
        return self.DEADLINE_S + 2.0 + self.REPLY_S + 1.0

    def _run(self, mode: str, rng: Any) -> None:
        from datetime import UTC, datetime, timedelta

        from sensorium.client import (
            DeadlineExceeded,
            DeferredOperation,
            InDoubt,
            Rejected,
            Retryable,
        )

        with Client(state_dir=str(self.paths.root)) as client:
            while not self._stop.is_set():
                key = new_id()
                refused = mode == "sync" and rng.random() < 0.05
                params: dict[str, Any] = {"seconds": "x" if refused else rng.uniform(0.05, 0.6)}
                action = "test.sleep" if mode == "sync" else "test.defer.sleep"
                deadline = datetime.now(UTC) + timedelta(seconds=self.DEADLINE_S)
                with self._lock:
                    self.sent += 1
                t0 = time.monotonic()
                kind, code, op_id = "other", None, None
                try:
                    got = client.invoke(
                        action,
                        params,
                        mode="sync" if mode == "sync" else "async",
                        idempotency_key=key,
                        retries=self.RETRIES,
                        reply_timeout_s=self.REPLY_S,
                        deadline_at=deadline,
                    )
                    if isinstance(got, DeferredOperation):
                        kind, op_id = "deferred", got.operation_id
                    else:
                        kind, code = "outcome", got.status
                except InDoubt as exc:
                    kind, code = "in-doubt", exc.code
                except (Rejected, DeadlineExceeded) as exc:  # refused before it ran
                    kind, code = "rejected", exc.code
                except Retryable as exc:
                    kind, code = "retryable", exc.code
                except CodedError as exc:
                    code = exc.code
                answer = Answer(mode, key, kind, code, time.monotonic() - t0, self.bound_s(), op_id)
                with self._lock:
                    self.answers.append(answer)
                self._stop.wait(rng.uniform(0.0, 0.3))


class Killer:
    """SIGKILLs a random process of the stack at random moments (seeded), never one that
    is not ready and never so often that the supervisor's burst limit (5 exits in 10 s)
    marks it failed; a killed supervisor is started again on the same state directory."""

    def __init__(self, stack: Stack, seed: int, max_supervisor_kills: int = 2) -> None:
        import random

        self.stack = stack
        self.rng = random.Random(seed)
        self.kills: list[tuple[float, str, int]] = []  # (time.time(), victim, pid)
        self.max_supervisor_kills = max_supervisor_kills

    def _eligible(self, states: dict[str, str], now: float) -> list[str]:
        recent = [v for t, v, _ in self.kills if now - t < 10.0]
        names = [n for n, s in states.items() if s == "ready" and recent.count(n) < 2]
        supervisor_kills = sum(v == "supervisor" for _t, v, _p in self.kills)
        all_ready = all(s == "ready" for s in states.values())
        if all_ready and supervisor_kills < self.max_supervisor_kills:
            names.append("supervisor")
        return names

    def kill_one(self, prefer: str | None = None) -> str | None:
        """Kill one eligible victim (``prefer`` when it is eligible); its name, or None
        when none was eligible."""
        try:
            status = {c.name: c for c in self.stack.status().children}
        except Exception:  # the supervisor is between lives
            return None
        now = time.time()
        names = self._eligible({n: c.state for n, c in status.items()}, now)
        if not names:
            return None
        victim = prefer if prefer in names else self.rng.choice(sorted(names))
        if victim == "supervisor":
            pid = self.stack.proc.pid
            self.kills.append((now, victim, pid))
            self.stack = restart_after_supervisor_kill(self.stack)
            return victim
        pid = status[victim].pid
        if pid is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.kills.append((now, victim, pid))
        return victim

    def run(self, seconds: float, pause_s: tuple[float, float] = (1.0, 3.0)) -> None:
        """Kill for ``seconds``; the supervisor at least once, somewhere in the middle."""
        start = time.monotonic()
        end = start + seconds
        supervisor_at = start + self.rng.uniform(0.3, 0.6) * seconds
        while time.monotonic() < end:
            time.sleep(min(self.rng.uniform(*pause_s), max(0.0, end - time.monotonic())))
            if time.monotonic() < end:
                owed = time.monotonic() >= supervisor_at and not any(
                    v == "supervisor" for _t, v, _p in self.kills
                )
                if owed:  # the supervisor is killed only with every child ready
                    with contextlib.suppress(AssertionError):
                        self.stack.wait_ready(15, actions=False)
                self.kill_one("supervisor" if owed else None)


def restart_after_supervisor_kill(stack: Stack, timeout_s: float = 30.0) -> Stack:
    """SIGKILL the supervisor, wait for its children to stop (each gets SIGTERM from the
    kernel), then start ``sensorium up`` again on the same state directory, as an
    operator would. The new stack is ready when this returns."""
    tree = stack.tree()
    stack.proc.kill()
    stack.proc.wait(timeout=5)
    _gone, alive = psutil.wait_procs(tree, timeout=timeout_s)
    assert not alive, f"left behind by the killed supervisor: {[p.pid for p in alive]}"
    fresh = start_stack(stack.paths)
    fresh.wait_ready(timeout_s)
    return fresh


def log_events(paths: StatePaths, process: str, event: str) -> list[dict[str, Any]]:
    """Every ``event`` line of ``logs/<process>.jsonl`` (torn lines of a killed writer skipped)."""
    found = []
    path = paths.log_file(process)
    if not path.exists():
        return found
    for line in path.read_text(errors="replace").splitlines():
        if f'"{event}"' not in line:
            continue
        with contextlib.suppress(json.JSONDecodeError):
            doc = json.loads(line)
            if doc.get("event") == event:
                found.append(doc)
    return found


def spawns_per_key(paths: StatePaths) -> dict[str, int]:
    """How many times the connector started an action under each idempotency/key
    (its ``action.started`` log events)."""
    counts: dict[str, int] = {}
    for doc in log_events(paths, "connector", "action.started"):
        key = doc.get("idempotency/key")
        if key:
            counts[key] = counts.get(key, 0) + 1
    return counts


def outcomes_per_key(paths: StatePaths) -> dict[str, int]:
    """Outcomes core recorded under each idempotency/key (more than one: two spawns ran)."""
    import apsw

    with apsw.Connection(str(paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as conn:
        conn.set_busy_timeout(5000)
        rows = conn.execute(
            "SELECT idempotency_key, count(*) FROM records WHERE kind = 'outcome' "
            "AND idempotency_key IS NOT NULL GROUP BY idempotency_key"
        ).fetchall()
    return {k: n for k, n in rows}


def integrity(paths: StatePaths) -> dict[str, str]:
    """``PRAGMA integrity_check`` of each durable store ("ok" when sound)."""
    import apsw

    result = {}
    for db in (paths.audit_db, paths.registry_db, paths.connector_jobs_db):
        with apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY) as conn:
            conn.set_busy_timeout(5000)
            rows = conn.execute("PRAGMA integrity_check").fetchall()
        result[db.name] = "; ".join(str(r[0]) for r in rows)
    return result


def open_operations(paths: StatePaths, within_s: float) -> dict[str, str]:
    """Operations of the registry not terminal once all are (or at ``within_s``)."""
    import apsw

    deadline = time.monotonic() + within_s
    while True:
        with apsw.Connection(str(paths.registry_db), flags=apsw.SQLITE_OPEN_READONLY) as conn:
            conn.set_busy_timeout(5000)
            rows = conn.execute("SELECT operation_id, status FROM operations").fetchall()
        left = {op: s for op, s in rows if s not in TERMINAL_OPS}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.25)


def wait_terminal(paths: StatePaths, operation_ids: list[str], within_s: float) -> dict[str, str]:
    """Each operation's final status, read with ``Client.wait`` (unreachable core is waited
    out, not fatal) until ``within_s`` runs out; "open" for one that did not end."""
    from sensorium.client import DeadlineExceeded, Retryable

    end = time.monotonic() + within_s
    final: dict[str, str] = {}
    with Client(state_dir=str(paths.root)) as client:
        for op in operation_ids:
            final[op] = "open"
            while time.monotonic() < end:
                try:
                    final[op] = client.wait(op, max(0.1, end - time.monotonic())).status
                    break
                except DeadlineExceeded:
                    break
                except Retryable:
                    time.sleep(0.2)
    return final


def free_port() -> int:
    """A tcp port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def keys_cli(root: str, *args: str) -> str:
    """`sensorium keys ARGS` on the state dir ``root``; its stdout (it must succeed)."""
    done = subprocess.run(
        [*SENSORIUM, "keys", *args, "--state-dir", root], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
