"""The poller process: owns the registry schema, keeps a line to core, reports health."""

from __future__ import annotations

import asyncio
import contextlib

import structlog
import zmq
import zmq.asyncio

from sensorium.poller.registry import open_registry
from sensorium.shared.config import NodeConfig, core_endpoint
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePaths
from sensorium.shared.process import keep_alive
from sensorium.shared.rpc.client import RpcClient, new_request_id
from sensorium.shared.sdnotify import Notifier
from sensorium.shared.wire.client_api import Health, HealthReply

log = structlog.get_logger("sensorium.poller")
HEALTH_INTERVAL_S = 10.0


async def _watch_core(core: RpcClient, notifier: Notifier, stop: asyncio.Event) -> None:
    """Say in STATUS whether core answers; the poller is ready either way."""
    last: str | None = None
    while not stop.is_set():
        try:
            reply = await core.call(Health(request_id=new_request_id()), HealthReply, 2.0)
            reachable, state = True, f"core {reply.instance_id} reachable"
        except CodedError as exc:
            reachable, state = False, f"core unreachable ({exc.code})"
        if state != last:
            log.info("poller.core", state=state)
            notifier.status(f"registry open; {state}")
            last = state
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEALTH_INTERVAL_S if reachable else 1.0)


async def serve(paths: StatePaths, cfg: NodeConfig, stop: asyncio.Event) -> None:
    notifier = Notifier()
    registry = open_registry(paths.registry_db)
    row = registry.execute(
        "SELECT count(*) FROM operations WHERE status IN ('pending', 'running')"
    ).fetchone()
    pending = int(row[0]) if row else 0
    ctx = zmq.asyncio.Context()
    core = RpcClient(ctx, core_endpoint(cfg, paths), name="core")
    log.info("poller.ready", registry=str(paths.registry_db), open_operations=pending)
    notifier.ready("registry open")
    watcher = asyncio.create_task(_watch_core(core, notifier, stop))
    await keep_alive(notifier, stop)
    notifier.stopping()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    await core.close()
    registry.close()
    ctx.term()
    log.info("poller.stopped")
