"""The OS connector process: hardened at start, its catalog proven, then it serves the seam.

Start-up (commits a killed connector left half-done, canaries, the job runner), the
seam server and an orderly stop; what each request does is ``service.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from pathlib import Path

import structlog
import zmq
import zmq.asyncio

from sensorium.connectors.os.effects.commit import recover
from sensorium.connectors.os.envelope.probe import Runtime
from sensorium.connectors.os.run.baseline import harden_self
from sensorium.connectors.os.run.sandbox.spawner import Spawner
from sensorium.connectors.os.service import ConnectorService, log_catalog
from sensorium.shared.config import NodeConfig, connector_endpoint
from sensorium.shared.paths import StatePaths
from sensorium.shared.process import keep_alive
from sensorium.shared.rpc.curve import connector_server_curve
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.sdnotify import Notifier
from sensorium.shared.wire.seam import (
    CORE_ROUTING_ID,
    ConnectorCancel,
    ConnectorInterrupt,
    ConnectorInvoke,
    ConnectorReport,
    ConnectorStarts,
    ConnectorStatus,
    ConnectorStatusBatch,
    ConnectorWatch,
    SeamRequestUnion,
)

log = structlog.get_logger("sensorium.connector")
# After the SIGKILL at a stop: the pipes close (launcher.DRAIN_AFTER_EXIT_S at most) and
# each outcome is built and sent.
KILLED_DRAIN_S = 3.0


def _sweep_scratch(root: Path) -> None:
    """Scratch dirs left by a connector that died mid-action."""
    if root.is_dir():
        for entry in root.iterdir():
            shutil.rmtree(entry, ignore_errors=True)


async def serve(paths: StatePaths, cfg: NodeConfig, stop: asyncio.Event) -> None:
    harden_self()
    notifier = Notifier()
    _sweep_scratch(paths.scratch)
    spawner = Spawner()
    spawner.start()
    service = ConnectorService(paths, cfg, Runtime.read(), spawner)
    # All or nothing across a crash: a commit a killed connector left half-done is
    # finished or undone before anything is served (and said in the log).
    for write_root in sorted(
        {d.fs_write.write_root for d in service.catalog.declarations.values() if d.fs_write}
    ):
        for line in await asyncio.to_thread(recover, Path(write_root)):
            log.warning("fswrite.recovered", detail=line)
    service.builder.start()
    await service.prove()
    runtime = service.runtime
    if runtime.tier != "namespaces":
        log.warning("sandbox.reduced", tier=runtime.tier, reason=runtime.why_not())
    service.jobs.start(service.catalog.config_hash if service.catalog.valid else None)
    log.info(
        "sandbox.probe",
        **runtime.mechanisms(),
        tier=runtime.tier,
        landlock_abi=runtime.landlock_abi,
        accounting="cgroup-v2" if service.builder.cgroups is not None else "rusage",
    )
    rep = service.report
    log_catalog(service)
    ctx = zmq.asyncio.Context()
    server = RpcServer(
        ctx,
        connector_endpoint(cfg, paths),
        SeamRequestUnion,
        {
            ConnectorInvoke: service.on_invoke,
            ConnectorReport: service.on_report,
            ConnectorStatus: service.on_status,
            ConnectorCancel: service.on_cancel,
            ConnectorStarts: service.on_starts,
            ConnectorWatch: service.jobs.watch,
            ConnectorStatusBatch: service.jobs.status_batch,
            ConnectorInterrupt: service.on_interrupt,
        },
        name="connector",
        # Core's replies outlive a core restart: its next incarnation reconciles them.
        hold_for=CORE_ROUTING_ID,
        curve=connector_server_curve(cfg, paths),
        max_inflight=cfg.limits.connector_max_inflight,
        max_message=cfg.limits.max_message_bytes,
    )
    server.bind()
    serving = server.start(on_crash=stop.set)
    log.info(
        "connector.ready",
        endpoint=server.endpoint,
        actions=len(rep.connector_actions),
        catalog_exposed=rep.catalog_exposed,
        config_hash=rep.config_hash,
        materialized=service.catalog.materialized,
    )
    notifier.ready(
        f"{len(rep.connector_actions)} actions; catalog "
        f"{'exposed' if rep.catalog_exposed else 'REFUSED'}"
    )
    await keep_alive(notifier, stop)
    notifier.stopping()
    log.info("connector.stopping", running=len(service.running), jobs=len(service.jobs.live))
    service.jobs.begin_stop()
    # Running actions get SIGTERM now and SIGKILL after the short stop grace (ADR-008);
    # each sync one is answered `failed`, interrupted. (A node's orderly stop stops core
    # first, which gives them the longer SIGTERM grace before this.)
    grace = cfg.limits.stop_grace_s
    signalled = time.monotonic()
    service.terminate_running()
    await server.drain(grace, then=service.kill_now, then_s=KILLED_DRAIN_S)
    # Jobs get what is left of the same grace, then SIGKILL; killed jobs end `failed`
    # with `shutting-down`, pending ones wait for the next start.
    left = max(0.0, grace - (time.monotonic() - signalled))
    await service.jobs.stop(grace + 1, grace_s=left)
    service.kill_running()
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    server.close()
    ctx.term()
    spawner.close()
    service.jobs.store.close()
    service.starts.close()
    log.info("connector.stopped")
    if server.crash is not None:
        raise RuntimeError("the connector's request loop crashed") from server.crash
