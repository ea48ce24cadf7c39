"""The supervisor process: event-driven, never polling for a child's death.

It learns of deaths from SIGCHLD, of readiness and liveness from sd_notify
datagrams, and of resource use from a psutil sample on an interval. As the
nearest child subreaper it also inherits — and kills — anything a dead child
left behind.

SIGHUP (logrotate) reopens the supervisor's own log and is passed on to each child
that has its handler in place; it stops nothing. ``control.py`` wires the signals,
the notify socket and the control socket to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Callable

import structlog

from sensorium.shared import logs
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import NodeConfig
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.shared.process import SUPERVISOR_PID_ENV
from sensorium.shared.wire.supervisor_api import (
    Ack,
    SupervisorRestart,
    SupervisorResume,
    SupervisorStatus,
    SupervisorStatusReply,
    SupervisorStop,
)
from sensorium.supervisor import housekeeping, stderrfiles
from sensorium.supervisor.child import Child, describe_status
from sensorium.supervisor.notify import NotifySocket, env_for_child
from sensorium.supervisor.policy import RestartPolicy
from sensorium.supervisor.stderrfiles import stderr_path

log = structlog.get_logger("sensorium.supervisor")
# Start order only; each process tolerates its peers being absent.
CHILDREN = (
    ("connector", "sensorium.connectors.os"),
    ("core", "sensorium.core"),
    ("poller", "sensorium.poller"),
)

# Stop order: core drains while the connector still runs what it sent; the poller
# only talks to core. Each step has the whole shutdown budget.
STOP_ORDER = (("core", "poller"), ("connector",))


class AlreadyRunning(Exception):
    pass


def _catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (its ``SigCgt`` mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


class Supervisor:
    def __init__(
        self,
        paths: StatePaths,
        cfg: NodeConfig,
        on_ready: Callable[[Supervisor], None] | None = None,
    ) -> None:
        self.paths = paths
        self.cfg = cfg
        self.started_at = rfc3339()
        self.children = {
            name: Child(name, module, RestartPolicy(cfg.supervisor)) for name, module in CHILDREN
        }
        self.by_pid: dict[int, Child] = {}
        # Restarts' processes spawned early and waiting for their word (``_start_early``).
        self.held: dict[int, Child] = {}
        # Children whose stderr file a thread is copy-truncating (housekeeping).
        self.rotating: set[str] = set()
        self.notify = NotifySocket(f"sensorium-notify-{new_id()}")
        self.stop_requested = asyncio.Event()
        self.stopping = False
        self._on_ready = on_ready
        self._announced = False
        self._lock_fd: int | None = None

    def __repr__(self) -> str:
        return f"<Supervisor {list(self.children.values())!r} stopping={self.stopping}>"

    # -- lifecycle --------------------------------------------------------

    def lock(self) -> None:
        """One supervisor per state directory."""
        self.paths.run.mkdir(parents=True, exist_ok=True)
        path = self.paths.run / "supervisor.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode().strip() or "?"
            os.close(fd)
            raise AlreadyRunning(
                f"a supervisor (pid {holder}) already runs for "
                f"{self.paths.root}; `sensorium status` shows it"
            ) from None
        # The pid is only what a refused second supervisor shows; a full disk may keep it.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _launch(self, child: Child, hold: int | None = None) -> int:
        env = env_for_child(self.notify.address, self.cfg.supervisor.watchdog_s)
        env["SENSORIUM_STATE_DIR"] = str(self.paths.root)
        env[SUPERVISOR_PID_ENV] = str(os.getpid())
        try:
            # Nobody holds the last incarnation's stderr any more: rotate it by renaming,
            # unless the sampling tick is copy-truncating it right now (in a thread).
            if child.name not in self.rotating:
                path = stderr_path(self.paths.logs, child.name)
                stderrfiles.rotate(path, self.cfg.logs, live=False)
        except OSError as exc:
            log.warning("process.stderr.rotate-failed", child=child.name, error=str(exc))
        return child.launch(self.paths, env, hold)

    def start(self, name: str) -> None:
        child = self.children[name]
        child.cancel_timers()
        early = child.release()
        if early is not None:
            del self.held[early]
        try:
            pid = child.adopt(early if early is not None else self._launch(child))
        except OSError as exc:
            log.error("process.spawn.failed", child=name, error=str(exc))
            self._schedule_restart(child, uptime=0.0)
            return
        self.by_pid[pid] = child
        loop = asyncio.get_running_loop()
        child.timers["ready"] = loop.call_later(
            self.cfg.supervisor.ready_timeout_s, self._ready_timeout, child
        )
        log.info("process.started", child=name, pid=pid, early=early is not None)

    def _start_early(self, child: Child) -> int | None:
        """Spawn a restart's process now, held until its backoff ends, so that the
        interpreter's start and its imports (most of a cold start) overlap the wait.
        It does nothing else before its word, so the backoff still holds: a process
        that crashes at once still crashes no more often than the policy allows.
        Best effort: without it (no fd, no process to spare) the start is cold."""
        try:
            read, write = os.pipe()
        except OSError as exc:
            log.warning("process.spawn.early-failed", child=child.name, error=str(exc))
            return None
        try:
            pid = self._launch(child, hold=read)
        except OSError as exc:
            os.close(write)
            log.warning("process.spawn.early-failed", child=child.name, error=str(exc))
            return None
        finally:
            os.close(read)
        child.held_pid, child.held_fd = pid, write
        self.held[pid] = child
        return pid

    def _ready_timeout(self, child: Child) -> None:
        if child.state == "starting" and child.pid:
            log.error(
                "process.ready.timeout",
                child=child.name,
                pid=child.pid,
                timeout_s=self.cfg.supervisor.ready_timeout_s,
            )
            child.kill_reason = "no READY=1 in time"
            self._kill(child)

    def stop_then_kill(self, child: Child, sig: int, grace_s: float = 1.0) -> None:
        """``sig`` now, SIGKILL after ``grace_s`` — to this incarnation only: the timer is
        cancelled with the child's others when it exits, so it never hits a successor."""
        self._kill(child, sig)
        child.cancel_timer("kill")
        child.timers["kill"] = asyncio.get_running_loop().call_later(grace_s, self._kill, child)

    def _kill(self, child: Child, sig: int = signal.SIGKILL) -> None:
        if child.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, sig)

    def on_sighup(self) -> None:
        """Reopen our log and pass SIGHUP on. Only to the child itself, not its group (an
        action there would die of it), and only once it catches SIGHUP: one still
        starting may not yet, and it opens its log after setting the handler, so a child
        that does not catch it yet has no file to reopen."""
        logs.reopen()
        passed = []
        for child in self.children.values():
            if child.pid and _catches(child.pid, signal.SIGHUP):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(child.pid, signal.SIGHUP)
                    passed.append(child.name)
        log.info("supervisor.logs.reopened", passed_to=passed)

    # -- events -----------------------------------------------------------

    def on_notify(self) -> None:
        for note in self.notify.receive():
            child = self.by_pid.get(note.pid)
            if child is None:
                continue
            if "STATUS" in note.fields:
                child.status_text = note.fields["STATUS"]
            if note.fields.get("READY") == "1" and child.state == "starting":
                child.state = "ready"
                child.cancel_timer("ready")
                log.info("process.ready", child=child.name, pid=child.pid, status=child.status_text)
                self._arm_watchdog(child)
                self._maybe_announce()
            if note.fields.get("WATCHDOG") == "1" and child.state == "ready":
                self._arm_watchdog(child)
            if note.fields.get("STOPPING") == "1" and child.state == "ready":
                child.state = "stopping"

    def _arm_watchdog(self, child: Child) -> None:
        child.cancel_timer("watchdog")
        child.timers["watchdog"] = asyncio.get_running_loop().call_later(
            self.cfg.supervisor.watchdog_s, self._watchdog_expired, child
        )

    def _watchdog_expired(self, child: Child) -> None:
        if child.state == "ready":
            log.error(
                "process.watchdog.expired",
                child=child.name,
                pid=child.pid,
                watchdog_s=self.cfg.supervisor.watchdog_s,
            )
            child.kill_reason = "watchdog expired: alive but not serving"
            self.stop_then_kill(child, signal.SIGABRT)

    def _maybe_announce(self) -> None:
        if not self._announced and all(c.state == "ready" for c in self.children.values()):
            self._announced = True
            log.info("supervisor.ready", pids={c.name: c.pid for c in self.children.values()})
            if self._on_ready is not None:
                self._on_ready(self)

    def on_sigchld(self) -> None:
        orphans = False
        while True:
            try:
                # Peek first: a managed child's group is killed while its unreaped pid still
                # pins the group id, so no recycled pid can be hit.
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if info is None:
                break
            child = self.by_pid.get(info.si_pid)
            if child is not None:
                self._kill(child)
            pid, status = os.waitpid(info.si_pid, 0)
            held = None if child is not None else self.held.pop(pid, None)
            if held is not None:
                if held.held_pid == pid:
                    held.drop_held()
                (log.info if self.stopping else log.warning)(
                    "process.held.exited", child=held.name, pid=pid, how=describe_status(status)
                )
                continue
            if self.by_pid.pop(pid, None) is None:
                orphans = True
                log.info("orphan.reaped", pid=pid, how=describe_status(status))
                continue
            assert child is not None
            self._on_exit(child, status)
        if orphans:
            # An orphan dying means others of its kind may still be around.
            self.sweep_orphans()

    def _on_exit(self, child: Child, status: int) -> None:
        uptime = child.uptime() or 0.0
        how = describe_status(status)
        child.cancel_timers()
        child.pid, child.proc = None, None
        self.sweep_orphans()
        if self.stopping:
            child.state = "stopped"
            log.info("process.stopped", child=child.name, how=how)
            return
        child.last_exit = f"{how} ({child.kill_reason})" if child.kill_reason else how
        if child.restart_requested:
            child.restart_requested = False
            child.restarts += 1
            log.info("process.restarted", child=child.name, how=how)
            self.start(child.name)
            return
        log.warning("process.exited", child=child.name, how=how, uptime_s=round(uptime, 2))
        self._schedule_restart(child, uptime)

    def _schedule_restart(self, child: Child, uptime: float) -> None:
        delay = child.policy.on_exit(time.monotonic(), uptime)
        if delay is None:
            child.state = "failed"
            log.error(
                "process.failed",
                child=child.name,
                burst=f"{self.cfg.supervisor.burst_limit} exits in "
                f"{self.cfg.supervisor.burst_window_s}s",
                hint=f"fix the cause, then `sensorium resume {child.name}`",
            )
            return
        child.state = "backoff"
        child.restarts += 1
        child.timers["restart"] = asyncio.get_running_loop().call_later(
            delay, self.start, child.name
        )
        early = self._start_early(child)
        log.info(
            "process.restart.scheduled", child=child.name, delay_s=round(delay, 3), held_pid=early
        )

    def sweep_orphans(self) -> None:
        """Kill whatever was re-parented to us: a dead child's stragglers."""
        housekeeping.sweep_orphans(set(self.by_pid) | set(self.held))

    async def sample_loop(self) -> None:
        await housekeeping.sample_loop(self)

    # -- control API ------------------------------------------------------

    async def on_status(self, _req: SupervisorStatus) -> SupervisorStatusReply:
        for child in self.children.values():
            child.sample()
        return SupervisorStatusReply(
            pid=os.getpid(),
            started_at=self.started_at,
            state_dir=str(self.paths.root),
            children=[c.status() for c in self.children.values()],
        )

    def _named(self, name: str) -> Child:
        child = self.children.get(name)
        if child is None:
            raise CodedError(
                RuntimeErrorCode.REQUEST_MALFORMED,
                f"no process {name!r}; one of {', '.join(self.children)}",
            )
        return child

    async def on_resume(self, req: SupervisorResume) -> Ack:
        child = self._named(req.process)
        if child.state not in ("failed", "stopped"):
            return Ack(ok=False, message=f"{child.name} is {child.state}; nothing to resume")
        child.policy.reset()
        self.start(child.name)
        return Ack(message=f"{child.name} restarted")

    async def on_restart(self, req: SupervisorRestart) -> Ack:
        child = self._named(req.process)
        if child.pid is None:
            return Ack(ok=False, message=f"{child.name} is {child.state}; `sensorium resume` it")
        child.restart_requested = True
        child.kill_reason = "restarted by the operator"
        self.stop_then_kill(child, signal.SIGTERM, self.cfg.supervisor.shutdown_budget_s)
        return Ack(message=f"{child.name} restarting")

    async def on_stop(self, _req: SupervisorStop) -> Ack:
        self.stop_requested.set()
        return Ack(message="stopping")

    # -- shutdown ---------------------------------------------------------

    async def shutdown(self) -> None:
        """Drain, in order, each step within a fixed budget; then nothing of ours is left.

        Core and the poller first: core stops admitting (a new directive gets a
        retryable ``shutting-down`` refusal) and answers every directive in flight while
        the connector still runs them. Only once core has exited does the connector get
        its SIGTERM: stopping it first (or with core) would cut directives core had
        already sent off into ``outcome-in-doubt``."""
        self.stopping = True
        budget = self.cfg.supervisor.shutdown_budget_s
        for child in self.children.values():
            child.cancel_timers()
            child.drop_held(kill=True)
            if child.state in ("backoff", "failed"):
                child.state = "stopped"
        live = [c.name for c in self.children.values() if c.pid]
        log.info("supervisor.stopping", processes=live, budget_s=budget, order=STOP_ORDER)
        for step in STOP_ORDER:
            await self._stop_step([self.children[name] for name in step], budget)
        end = time.monotonic() + 2.0
        while self.held and time.monotonic() < end:  # killed above: gone at once
            self.on_sigchld()
            await asyncio.sleep(0.01)
        self.sweep_orphans()
        self.on_sigchld()
        log.info("supervisor.stopped")

    async def _stop_step(self, children: list[Child], budget: float) -> None:
        """SIGTERM ``children``, wait up to ``budget`` for them to exit, SIGKILL the rest."""
        for child in children:
            if child.pid:
                child.state = "stopping"
                self._kill(child, signal.SIGTERM)
        deadline = time.monotonic() + budget
        while any(c.pid for c in children) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            self.on_sigchld()
        for child in children:
            if child.pid:
                log.error("process.stop.overdue", child=child.name, pid=child.pid)
                self._kill(child)
        end = time.monotonic() + 2.0
        while any(c.pid for c in children) and time.monotonic() < end:
            await asyncio.sleep(0.02)
            self.on_sigchld()
