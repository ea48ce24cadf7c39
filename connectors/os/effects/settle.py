"""What an action's effects become once it has run: C3 commits, C5 promotions, C4 transcripts.

Each is decided by the connector after the action's namespace is gone, from what
the kernel kept (the overlay's upper layer, the artifact tmpfs, the relay's
counters); the action has no say in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from sensorium.connectors.os.effects import artifacts, commit, fswrite
from sensorium.connectors.os.envelope.classes import effects
from sensorium.connectors.os.envelope.prepared import Prepared
from sensorium.connectors.os.run.sandbox import fsprofile
from sensorium.connectors.os.run.sandbox.channel import SetupChannel
from sensorium.connectors.os.run.spawning import SpawnResult
from sensorium.shared.config import EgressConfig
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.fs_policy import FsPolicy
from sensorium.shared.wire.outcome import Diagnostic, EvidenceRef, FileTouched, TranscriptRow

log = structlog.get_logger("sensorium.connector")
MAX_NOTES = 20


@dataclass
class Effects:
    files_touched: list[FileTouched] = field(default_factory=list)
    artifact_refs: list[EvidenceRef] = field(default_factory=list)
    transcript: list[TranscriptRow] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def violation(self, message: str) -> None:
        self.diagnostics.append(
            Diagnostic(code=RuntimeErrorCode.ENVELOPE_VIOLATION, message=message)
        )


def _problems(what: str, problems: tuple[str, ...]) -> str:
    shown = "; ".join(problems[:MAX_NOTES])
    more = f"; and {len(problems) - MAX_NOTES} more" if len(problems) > MAX_NOTES else ""
    return f"{what}: {shown}{more}"


def settle(
    decl: Declaration, prepared: Prepared, run: SpawnResult, policy: FsPolicy, lane: Path
) -> Effects:
    """Commit or discard C3 writes and promote or discard C5 artifacts (blocking I/O)."""
    out = Effects()
    # Only a run that ended by itself, within its time, is kept: a signal (SIGXFSZ
    # past the per-file cap, the OOM killer, a torn-down sandbox) voids it.
    clean = run.spawn_error is None and not run.timed_out and run.signal is None
    fx = effects(decl)
    if "scoped-fs-write" in fx and prepared.upper is not None and decl.fs_write is not None:
        w = decl.fs_write
        profile = fsprofile.effective_profile(policy, decl.fs_profile)
        inspection = fswrite.inspect(
            prepared.upper,
            write_root=Path(w.write_root),
            max_bytes_total=w.max_bytes_total,
            max_bytes_per_file=w.max_bytes_per_file,
            path_pattern=w.path_pattern,
            may_modify=lambda p: fsprofile.check_path(profile.modify, p, base=w.write_root),
            xattr_prefix=prepared.xattr_prefix,
            max_files=w.max_files,
        )
        out.files_touched = list(inspection.files)
        if not clean:
            why = (
                "timed out"
                if run.timed_out
                else "did not start"
                if run.spawn_error
                else f"was killed by signal {run.signal}"
            )
            out.violation(f"nothing was committed to {w.write_root}: the action {why}")
        elif not inspection.ok:
            out.violation(
                _problems(f"nothing was committed to {w.write_root}", inspection.problems)
            )
        elif inspection.files:
            try:
                commit.commit(inspection, prepared.upper, Path(w.write_root))
            except fswrite.CommitError as exc:
                out.violation(f"nothing was committed to {w.write_root}: {exc}")
    if "artifact-produce" in fx and prepared.artifacts is not None and decl.artifact is not None:
        a = decl.artifact
        if not clean:
            out.violation("no artifact was promoted: the action did not end by itself in time")
        else:
            try:
                promotion = artifacts.promote(
                    prepared.artifacts,
                    lane=lane,
                    max_count=a.max_count,
                    max_bytes_per=a.max_bytes_per,
                    max_bytes_total=a.max_bytes_total,
                    allowed_media_types=a.allowed_media_types,
                )
            except CodedError as exc:
                # The action ran: its outcome says what was not kept, rather than an
                # error that reads as "nothing ran" and invites a second run.
                out.diagnostics.append(
                    Diagnostic(code=exc.code, message=f"no artifact was kept: {exc.message}")
                )
                return out
            if promotion.ok:
                out.artifact_refs = list(promotion.refs)
            else:
                out.violation(_problems("no artifact was promoted", promotion.problems))
            if promotion.skipped:
                out.violation(_problems("entries never promoted", promotion.skipped))
    return out


class EgressSession:
    """C4: relays through the listeners the action's namespace hands back.

    ``limits`` caps the connections it holds open at once, and (through the budget all
    sessions of this process share) those of every action together."""

    def __init__(self, decl: Declaration, limits: EgressConfig | None = None) -> None:
        from sensorium.connectors.os.effects.egress.dns import SyntheticAddresses
        from sensorium.connectors.os.effects.egress.relay import EgressRelay, process_budget

        assert decl.egress_network is not None
        limits = limits or EgressConfig()
        self.addresses = SyntheticAddresses(decl.egress_network.endpoints)
        self.relay = EgressRelay(
            decl.egress_network,
            self.addresses,
            max_open=limits.max_connections_per_action,
            budget=process_budget(limits.max_connections_total),
            allow_private_answers=limits.allow_private_answers,
        )
        self._task: asyncio.Task[None] | None = None

    def begin(self, channel: SetupChannel, skip: int) -> None:
        """Relay once the init sent its fds: the listeners follow ``skip`` exported mounts."""
        self._task = asyncio.get_running_loop().create_task(self._receive(channel, skip))

    async def _receive(self, channel: SetupChannel, skip: int) -> None:
        fds = (await channel.wait())[skip:]
        if not fds:
            return
        # The channel keeps its fds (closed with it); the relay owns copies.
        socks = [socket.socket(fileno=os.dup(fd)) for fd in fds]
        for s in socks:
            s.setblocking(False)
        await self.relay.start(socks[:-1], socks[-1])

    async def finish(self, out: Effects) -> None:
        """Close the relay and account for it; safe on every path, also unstarted."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        await self.relay.close()
        out.transcript = self.relay.transcript()
        refusals = self.relay.refusals()
        if refusals:
            out.violation(_problems("egress refused", tuple(refusals)))
        for row, note in zip(out.transcript, self.relay.notes, strict=False):
            if note and self.relay.is_violation(note):
                out.violation(f"{row.host}:{row.port}: {note}")
            elif note:  # the network's doing, seen by the action as by any program
                log.info("egress.connection-ended", host=row.host, port=row.port, note=note)
        refused_names = self.relay.dns_refused()
        if refused_names:
            log.info("egress.dns-refused", names=refused_names[:MAX_NOTES])
