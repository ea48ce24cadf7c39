"""The supervisor's sampling tick: orphans swept, stderr files bounded, limits enforced.

Every ``supervisor.sample_interval_s``: whatever was re-parented to the supervisor is
killed, each running child's ``.stderr`` is copy-truncated past ``logs.max_bytes``, and
each ready child's RSS and open fds are sampled against their limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import TYPE_CHECKING

import psutil
import structlog

from sensorium.supervisor import stderrfiles
from sensorium.supervisor.stderrfiles import stderr_path

if TYPE_CHECKING:
    from sensorium.supervisor.service import Supervisor

log = structlog.get_logger("sensorium.supervisor")


def sweep_orphans(managed: set[int]) -> None:
    """Kill every child of ours that is not in ``managed``: a dead child's stragglers."""
    try:
        kids = psutil.Process().children()
    except psutil.Error:
        return
    for proc in kids:
        if proc.pid in managed:
            continue
        log.warning("orphan.killed", pid=proc.pid, name=proc.name())
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            proc.kill()


async def bound_stderr(sup: Supervisor) -> None:
    """Copy-truncate each running child's ``.stderr`` past ``logs.max_bytes``."""
    for child in sup.children.values():
        if child.pid is None:
            continue
        path = stderr_path(sup.paths.logs, child.name)
        sup.rotating.add(child.name)
        try:
            if await asyncio.to_thread(stderrfiles.rotate, path, sup.cfg.logs, live=True):
                log.info("process.stderr.rotated", child=child.name, path=str(path))
        except OSError as exc:
            log.warning("process.stderr.rotate-failed", child=child.name, error=str(exc))
        finally:
            sup.rotating.discard(child.name)


async def sample_loop(sup: Supervisor) -> None:
    cfg = sup.cfg.supervisor
    while not sup.stopping:
        await asyncio.sleep(cfg.sample_interval_s)
        # Descendants that escaped an action (setsid, double fork) end up re-parented
        # here; no class permits a process that outlives its directive.
        sup.sweep_orphans()
        await bound_stderr(sup)
        for child in sup.children.values():
            if child.state != "ready":
                continue
            child.sample()
            if child.proc is not None:
                with contextlib.suppress(psutil.Error):
                    if child.proc.status() == psutil.STATUS_ZOMBIE:
                        sup.on_sigchld()
                        continue
            over = []
            if child.rss_bytes and child.rss_bytes > cfg.max_rss_bytes:
                over.append(f"rss {child.rss_bytes} > {cfg.max_rss_bytes}")
            if child.fds and child.fds > cfg.max_fds:
                over.append(f"fds {child.fds} > {cfg.max_fds}")
            if over:
                log.error("process.limit.exceeded", child=child.name, limits=over)
                child.kill_reason = "over its limits: " + ", ".join(over)
                sup.stop_then_kill(child, signal.SIGTERM, sup.cfg.limits.sigterm_grace_s)
