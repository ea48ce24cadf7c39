"""The sensorium-core process: its sockets, tasks and orderly stop around ``CoreService``."""

from __future__ import annotations

import asyncio
import contextlib

import structlog
import zmq
import zmq.asyncio

from sensorium.core import resolution
from sensorium.core.dispatch import INTERRUPT_DRAIN_S
from sensorium.core.grants import core_server_security
from sensorium.core.service import CoreService
from sensorium.shared.config import NodeConfig, core_endpoint
from sensorium.shared.diagnostics import OsErrorCode
from sensorium.shared.paths import StatePaths
from sensorium.shared.process import keep_alive
from sensorium.shared.rpc.curvekeys import CORE, CurveStore
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.sdnotify import Notifier
from sensorium.shared.wire.client_api import ClientRequest, Invoke

log = structlog.get_logger("sensorium.core")


def _warmed(task: asyncio.Task[None]) -> None:
    """Said now, not only when the first directive's parameters fail to validate."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("core.validators.unavailable", error=repr(exc))


async def serve(paths: StatePaths, cfg: NodeConfig, stop: asyncio.Event) -> None:
    notifier = Notifier()
    ctx = zmq.asyncio.Context()
    core = CoreService(paths, cfg, ctx, notifier)
    security = core_server_security(
        cfg,
        paths,
        group_of=core.group_of,
        action_of_operation=lambda o: op.action_id if (op := core.registry.get(o)) else None,
    )
    if security.curve is not None:
        core.access.clients(security.curve.allowlist, CurveStore(paths).public(CORE))
    core.directives.authorize_invoke = security.authorize
    server = RpcServer(
        ctx,
        core_endpoint(cfg, paths),
        ClientRequest,
        core.handlers(),
        name="core",
        missing_field_codes={"directive": OsErrorCode.DIRECTIVE_MISSING},
        max_inflight=cfg.limits.core_max_inflight,
        max_message=cfg.limits.max_message_bytes,
        curve=security.curve,
        authorize=core.access.audited(security.authorize, skip=Invoke)
        if security.authorize
        else None,
        on_request=core.recorder.observe,
        at_once={Invoke: core.directives.refused_at_once},
    )
    core.server = server
    server.bind()
    await core.signer.start()
    serving = server.start(on_crash=stop.set)
    flows = asyncio.create_task(core.flows.serve(stop), name="flow-runner")
    orphans = asyncio.create_task(core.orphans.serve(stop), name="orphan-desk")
    sweep = asyncio.create_task(
        core.audit_desk.serve(stop, cfg.limits.audit_sweep_s), name="audit-sweep"
    )
    completions = asyncio.create_task(core.completions.serve(stop), name="completions")
    warming = asyncio.create_task(asyncio.to_thread(resolution.warm), name="warm-validators")
    warming.add_done_callback(_warmed)
    # Ready means a directive can be admitted: once the connector's catalog is known (or
    # after limits.core_ready_wait_s; core serves without it, and says so).
    notifier.status("waiting for the connector's report")
    reported = await core.catalog.first_report(cfg.limits.core_ready_wait_s, stop)
    if not stop.is_set():
        log.info(
            "core.ready",
            endpoint=server.endpoint,
            connector=core.connector.endpoint,
            connector_reported=reported,
        )
        notifier.ready(core.catalog.status_line())
    await keep_alive(notifier, stop)
    notifier.stopping()
    warming.cancel()
    log.info("core.stopping", inflight=server.inflight)
    core.completions.close()  # held waits are answered now, not at their timeout
    # The running actions get the grace to finish; those still running are then ended
    # by the connector and answered (failed, interrupted) before core goes.
    await server.drain(
        cfg.limits.sigterm_grace_s, then=core.directives.interrupt_running, then_s=INTERRUPT_DRAIN_S
    )
    await server.quiesce()
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    with contextlib.suppress(asyncio.CancelledError):
        await flows
    with contextlib.suppress(asyncio.CancelledError):
        await orphans
    with contextlib.suppress(asyncio.CancelledError):
        await sweep
    completions.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await completions
    server.close()
    core.signer.close()
    await core.connector.close()
    core.recorder.close()
    core.audit.close()
    core.registry.close()
    core.observer.close()
    ctx.term()
    log.info("core.stopped")
    if server.crash is not None:
        raise RuntimeError("core's request loop crashed") from server.crash
