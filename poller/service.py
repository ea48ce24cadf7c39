"""The poller process: drives deferred operations under host policy, reports health."""

from __future__ import annotations

import asyncio
import contextlib

import structlog
import zmq
import zmq.asyncio

from sensorium import __version__
from sensorium.poller.poller import DeferredOperationPoller
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import NodeConfig, core_endpoint
from sensorium.shared.deferred import leases
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.registry import Registry
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.shared.process import keep_alive
from sensorium.shared.rpc.client import RpcClient, new_request_id
from sensorium.shared.rpc.curve import core_client_curve
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.sdnotify import Notifier
from sensorium.shared.wire.client_api import Health, HealthReply
from sensorium.shared.wire.seam import POLLER_ROUTING_PREFIX

log = structlog.get_logger("sensorium.poller")
HEALTH_INTERVAL_S = 10.0


async def _watch_core(
    core: RpcClient, registry: Registry, notifier: Notifier, stop: asyncio.Event
) -> None:
    """Say in STATUS whether core answers and how many operations are open."""
    last: str | None = None
    while not stop.is_set():
        try:
            reply = await core.call(Health(request_id=new_request_id()), HealthReply, 2.0)
            reachable, state = True, f"core {reply.instance_id} reachable"
        except CodedError as exc:
            reachable, state = False, f"core unreachable ({exc.code})"
        counts = await asyncio.to_thread(registry.counts)
        open_ops = counts.get("pending", 0) + counts.get("running", 0)
        line = f"registry open; {state}; {open_ops} open operations"
        if line != last:
            log.info("poller.core", state=state, open_operations=open_ops)
            notifier.status(line)
            last = line
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEALTH_INTERVAL_S if reachable else 1.0)


async def serve(paths: StatePaths, cfg: NodeConfig, stop: asyncio.Event) -> None:
    notifier = Notifier()
    registry = Registry(paths.registry_db, DeferredHostPolicy.from_config(cfg.deferred))
    counts = registry.counts()
    ctx = zmq.asyncio.Context()
    instance = new_id()
    core = RpcClient(
        ctx,
        core_endpoint(cfg, paths),
        name="core",
        curve=core_client_curve(cfg, paths),
        routing_id=POLLER_ROUTING_PREFIX + instance.encode(),
    )
    # The lease owner names this process too: a restart releases a killed one's leases.
    owner = leases.owner_of("poller", instance)
    poller = DeferredOperationPoller(registry, core, cfg.deferred, owner=owner)
    log.info(
        "poller.ready",
        registry=str(paths.registry_db),
        open_operations=counts.get("pending", 0) + counts.get("running", 0),
        owner=poller.owner,
    )
    # Its control socket (run/poller.sock): `sensorium status` asks the poller itself,
    # and the watchdog's probe proves that its loop answers there.
    started_at = rfc3339()

    async def on_health(_req: Health) -> HealthReply:
        return HealthReply(
            process="poller", instance_id=instance, started_at=started_at, version=__version__
        )

    control = RpcServer(
        ctx, paths.ipc("poller"), Health, {Health: on_health}, name="poller", max_inflight=16
    )
    control.bind()
    serving = control.start(on_crash=stop.set)
    notifier.ready("registry open")
    polls_stop = asyncio.Event()
    polling = asyncio.create_task(poller.run(polls_stop), name="poller")

    def crashed(task: asyncio.Task[None]) -> None:
        # A poller that stopped polling must not look healthy: stop, be restarted.
        if not task.cancelled() and task.exception() is not None:
            log.error("poller.crashed", error=repr(task.exception()))
            stop.set()

    polling.add_done_callback(crashed)
    watcher = asyncio.create_task(_watch_core(core, registry, notifier, stop))
    await keep_alive(notifier, stop)
    notifier.stopping()
    polls_stop.set()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    with contextlib.suppress(asyncio.CancelledError):
        await polling
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    control.close()
    await core.close()
    registry.close()
    ctx.term()
    log.info("poller.stopped", polled=poller.polled)
