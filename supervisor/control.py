"""The supervisor's event wiring: signals, the notify socket and the control socket.

:func:`run` turns SIGCHLD, SIGHUP and sd_notify datagrams into calls on the
:class:`~.service.Supervisor`, serves its control requests, and stops it in order.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import structlog
import zmq
import zmq.asyncio

from sensorium.shared.config import NodeConfig, supervisor_endpoint
from sensorium.shared.paths import StatePaths
from sensorium.shared.prctl import PR_SET_CHILD_SUBREAPER, prctl
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.wire.supervisor_api import (
    ControlRequestUnion,
    SupervisorRestart,
    SupervisorResume,
    SupervisorStatus,
    SupervisorStop,
)
from sensorium.supervisor.service import Supervisor

log = structlog.get_logger("sensorium.supervisor")


def _become_subreaper() -> None:
    try:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError as exc:
        log.warning("supervisor.subreaper.unavailable", error=str(exc))


async def run(
    paths: StatePaths,
    cfg: NodeConfig,
    stop: asyncio.Event,
    on_ready: Callable[[Supervisor], None] | None = None,
    hung_up: Callable[[], bool] | None = None,
) -> None:
    """Run the children until ``stop``. A SIGHUP for which ``hung_up`` says true (our
    terminal went away) stops like ``stop``; any other reopens the logs."""
    sup = Supervisor(paths, cfg, on_ready)
    sup.lock()
    _become_subreaper()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGCHLD, sup.on_sigchld)

    def on_sighup() -> None:
        if hung_up is not None and hung_up():
            log.info("supervisor.terminal.hangup")
            stop.set()
        else:
            sup.on_sighup()

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    loop.add_reader(sup.notify.fileno(), sup.on_notify)
    ctx = zmq.asyncio.Context()
    control = RpcServer(
        ctx,
        supervisor_endpoint(cfg, paths),
        ControlRequestUnion,
        {
            SupervisorStatus: sup.on_status,
            SupervisorResume: sup.on_resume,
            SupervisorStop: sup.on_stop,
            SupervisorRestart: sup.on_restart,
        },
        name="supervisor",
        max_inflight=64,
    )
    control.bind()
    serving = control.start(on_crash=sup.stop_requested.set)
    sampler = asyncio.create_task(sup.sample_loop())
    for name in sup.children:
        sup.start(name)
    stopper = asyncio.create_task(sup.stop_requested.wait())
    await asyncio.wait(
        [stopper, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    try:
        await sup.shutdown()
    finally:
        for task in (serving, sampler, stopper):
            task.cancel()
        loop.remove_reader(sup.notify.fileno())
        sup.notify.close()
        control.close()
        ctx.term()
