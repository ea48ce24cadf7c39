"""One directive run in its envelope, and its outcome built: the sync path's and every
job's. Interrupts, a settled write layer or artifacts, the ``degraded`` note."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog

from sensorium.connectors.os.effects.settle import Effects, settle
from sensorium.connectors.os.envelope.builder import EnvelopeBuilder
from sensorium.connectors.os.envelope.prepared import Prepared
from sensorium.connectors.os.envelope.render import RenderError
from sensorium.connectors.os.jobs.runner import Live
from sensorium.connectors.os.run.interrupts import Interrupts
from sensorium.connectors.os.run.launcher import spawn
from sensorium.connectors.os.run.results import build_outcome, fit_outcome
from sensorium.connectors.os.run.sandbox.script import ScriptError
from sensorium.connectors.os.run.spawning import Killable, NotStarted, SpawnResult
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.fs_policy import FsPolicy
from sensorium.shared.wire.outcome import Diagnostic, Outcome
from sensorium.shared.wire.report import LedgerState

log = structlog.get_logger("sensorium.connector")

StateOf = Callable[[Declaration], tuple[LedgerState, list[str]]]


class Executor:
    """Builds each action's envelope (``EnvelopeBuilder``), runs it (``launcher.spawn``)
    and turns what happened into its ``Outcome``."""

    def __init__(
        self,
        paths: StatePaths,
        builder: EnvelopeBuilder,
        policy: FsPolicy,
        interrupts: Interrupts,
        state_of: StateOf,
        max_message_bytes: int,
    ) -> None:
        self.paths = paths
        self.builder = builder
        self.policy = policy
        self.interrupts = interrupts
        self.state_of = state_of
        self.max_message_bytes = max_message_bytes

    def prepare(
        self,
        decl: Declaration,
        parameters: dict[str, Any],
        run_id: str,
        timeout_ms: int,
        signer_token: str | None = None,
    ) -> Prepared:
        """The action's envelope, or the coded reason it cannot be built."""
        try:
            return self.builder.prepare(
                decl, parameters, run_id, timeout_ms / 1000, signer_token=signer_token
            )
        except RenderError as exc:
            raise CodedError(
                OsErrorCode.PARAMETERS_INVALID,
                str(exc),
                path=f"$.parameters.{exc.name}" if exc.name else None,
            ) from None
        except ScriptError as exc:
            raise CodedError(exc.code, str(exc)) from None
        except OSError as exc:
            raise CodedError(
                RuntimeErrorCode.SPAWN_FAILED,
                f"could not build the action's envelope: {exc}",
            ) from None

    async def execute(
        self,
        decl: Declaration,
        directive: Directive,
        timeout_ms: int,
        authorized: bool,
        live: Live | None = None,
        before_spawn: Callable[[], Awaitable[None]] | None = None,
        signer_token: str | None = None,
        admitted_as: tuple[LedgerState, list[str]] | None = None,
    ) -> tuple[Outcome, SpawnResult]:
        """Run one directive in its envelope and build its outcome: the sync path, and
        every job with its ``live`` record, which holds the job's own process handles
        and hears when its process starts and when it has exited. ``before_spawn``
        (the sync path's start journal) runs while the sandbox is built, and the action
        runs only once it returned; if it raises, nothing of the action runs and its
        error is raised as it was. ``admitted_as``: the ledger state it was just
        admitted under (else it is worked out again), for the ``degraded`` note."""
        outcome_id = new_id()
        prepared = self.prepare(decl, directive.parameters, outcome_id, timeout_ms, signer_token)
        handles: set[Killable] = (
            self.interrupts.handles_for(directive.directive_id) if live is None else live.handles
        )
        argv = prepared.argv
        done = Effects()
        try:
            if live is not None:
                live.on_stage("spawning")
            prepared.begin()

            async def gate() -> None:
                if before_spawn is not None:
                    await before_spawn()  # written before the action runs, or it never does
                # Logged before the action runs, so even a connector killed mid-run leaves
                # the record that counts attempts per idempotency/key (the fault suites
                # read it).
                log.info(
                    "action.started",
                    action_id=directive.action_id,
                    **{
                        "directive/id": directive.directive_id,
                        "idempotency/key": directive.idempotency_key,
                    },
                )

            try:
                # The sandbox is built while the start journal writes (launcher.spawn).
                run = await spawn(prepared.spec, handles, prepared.sandbox, gate=gate())
                if live is not None:
                    live.on_stage("exited")
                prepared.collect()
                prepared.account(run)
                if prepared.upper is not None or prepared.artifacts is not None:
                    done = await _settle(decl, prepared, run, self.policy, self.paths)
            except NotStarted as exc:
                raise exc.cause from None  # the start journal refused it: nothing ran
            except CodedError as exc:
                # Past this point the action may have run: never an answer that reads
                # as "nothing ran" (a caller would retry it into a second run).
                raise CodedError(
                    exc.code,
                    exc.message,
                    path=exc.path,
                    detail={**exc.detail, "in_flight": "true"},
                ) from exc
        finally:
            interrupted = live is None and self.interrupts.done(directive.directive_id)
            if prepared.egress is not None:
                await prepared.egress.finish(done)
            prepared.cleanup()
        outcome = build_outcome(
            outcome_id=outcome_id,
            directive=directive,
            decl=decl,
            argv=argv,
            timeout_ms=timeout_ms,
            run=run,
            unauthorized=not authorized,
            produced=done,
        )
        if interrupted:
            ended = Diagnostic(
                code=RuntimeErrorCode.SHUTTING_DOWN,
                message="interrupted: the node stopped while it ran; its process group "
                "was killed (it may have done part of its work)",
            )
            outcome = msgspec.structs.replace(
                outcome, status="failed", diagnostics=[ended, *outcome.diagnostics]
            )
        # A job's state now, not when it was accepted: it may have waited for a slot.
        state, gaps = admitted_as if admitted_as is not None else self.state_of(decl)
        if state == "degraded":
            # What the declaration gave up rides with every outcome, not only the ledger.
            given_up = Diagnostic(
                code=RuntimeErrorCode.ENVELOPE_DEGRADED,
                message="ran degraded, by its declaration's allow_fallback: " + "; ".join(gaps),
            )
            outcome = msgspec.structs.replace(outcome, diagnostics=[*outcome.diagnostics, given_up])
        return fit_outcome(outcome, self.max_message_bytes), run


async def _settle(
    decl: Declaration, prepared: Prepared, run: SpawnResult, policy: FsPolicy, paths: StatePaths
) -> Effects:
    """The commit or promotion in a thread, seen through to its end even if we are
    cancelled: the layer's fds must not be closed under a running commit."""
    task = asyncio.ensure_future(
        asyncio.to_thread(settle, decl, prepared, run, policy, paths.artifacts.parent)
    )
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await task
        raise
