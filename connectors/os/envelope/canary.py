"""Canaries: a no-op run under exactly an envelope is the only proof that it can be built.

A kernel can list a mechanism and still refuse it (a container's seccomp profile
forbids ``unshare``; an unprivileged mount of a tmpfs with ``uid=0``; an LSM that
rejects Landlock). So the connector first finds its tier with the smallest
envelope (namespaces, else Landlock alone), then runs ``true`` under each
distinct envelope of its catalog — every namespace, mount, Landlock rule, seccomp
filter, rlimit and relay socket the action would get, only the program differs.
An action whose canary did not run clean is ``unsupported_by_runtime`` with the
step and errno that failed; nothing is enabled on a feature probe alone.
"""

from __future__ import annotations

import dataclasses
import shutil

import msgspec
import structlog

from sensorium.connectors.os.envelope.builder import EnvelopeBuilder
from sensorium.connectors.os.envelope.prepared import Prepared
from sensorium.connectors.os.envelope.probe import SCOPES_ABI, Runtime, Tier
from sensorium.connectors.os.run.launcher import spawn
from sensorium.connectors.os.run.sandbox.plan import ENCODER
from sensorium.shared.ids import new_id
from sensorium.shared.wire.declaration import Declaration

log = structlog.get_logger("sensorium.connector")
CANARY_TIMEOUT_S = 10.0
# The smallest envelope: what every action gets, with the default fs profile.
BASE = msgspec.convert(
    {
        "action_id": "sensorium.canary",
        "class": "read-only-spawn",
        "executable": {"kind": "binary", "path": "/bin/true", "argv_shape": ["true"]},
        "parameters_schema": {"type": "object"},
    },
    type=Declaration,
)


def _true() -> str:
    return shutil.which("true", path="/usr/bin:/bin") or "/bin/true"


def _shape(prepared: Prepared, run_id: str) -> bytes:
    """The envelope without what differs per run: equal shapes need one canary."""
    assert prepared.sandbox is not None
    return ENCODER.encode(prepared.sandbox.plan).replace(run_id.encode(), b"RUN")


async def _run(prepared: Prepared) -> str | None:
    from sensorium.connectors.os.effects.settle import Effects

    assert prepared.sandbox is not None
    try:
        prepared.begin()
        run = await spawn(prepared.spec, None, prepared.sandbox)
        prepared.collect()
        if run.spawn_error is not None:
            return run.spawn_error
        if run.exit_code != 0:
            detail = run.stderr.data.decode(errors="replace").strip()[:200]
            return f"true exited {run.exit_code} (signal {run.signal}): {detail}"
        missing = [
            name
            for name, fd in (("layer", prepared.upper), ("artifacts", prepared.artifacts))
            if name in prepared.exports and fd is None
        ]
        if missing:
            return f"the sandbox did not hand back its {' and '.join(missing)} mount"
        return None
    finally:
        if prepared.egress is not None:
            await prepared.egress.finish(Effects())
        prepared.cleanup()


class Canaries:
    """Runs canaries for a builder and remembers each envelope shape's verdict."""

    def __init__(self, builder: EnvelopeBuilder) -> None:
        self.builder = builder
        self.by_shape: dict[bytes, str | None] = {}

    def __repr__(self) -> str:
        return f"<Canaries shapes={len(self.by_shape)}>"

    async def check(self, decl: Declaration) -> str | None:
        """None when a no-op ran clean under exactly ``decl``'s envelope; else why not."""
        run_id = f"canary-{new_id()}"
        try:
            prepared = self.builder.prepare(decl, {}, run_id, CANARY_TIMEOUT_S, canary=_true())
        except Exception as exc:  # an envelope that cannot even be planned here
            return f"the envelope cannot be built: {exc}"
        shape = _shape(prepared, run_id)
        if shape in self.by_shape:
            prepared.cleanup()
            return self.by_shape[shape]
        try:
            verdict = await _run(prepared)
        except Exception as exc:
            verdict = f"{type(exc).__name__}: {exc}"
        self.by_shape[shape] = verdict
        return verdict

    async def catalog(self, declarations: dict[str, Declaration]) -> dict[str, str | None]:
        """Every declaration's verdict; logged once per failing shape."""
        verdicts = {aid: await self.check(decl) for aid, decl in declarations.items()}
        failed = {aid: v for aid, v in verdicts.items() if v is not None}
        if failed:
            log.warning("sandbox.canary-failed", tier=self.builder.runtime.tier, actions=failed)
        log.info(
            "sandbox.canaries",
            tier=self.builder.runtime.tier,
            shapes=len(self.by_shape),
            enabled=len(verdicts) - len(failed),
            refused=len(failed),
        )
        return verdicts


# The namespace tier's variants, strongest first: (through a user namespace as root,
# with a fresh procfs). A container without CAP_SYS_ADMIN still lets root create a
# user namespace; one that masks /proc refuses a new procfs.
_VARIANTS = ((True, True), (False, True), (True, False), (False, False))


async def choose_tier(runtime: Runtime, builder: EnvelopeBuilder) -> Runtime:
    """The strongest tier whose base canary runs here; "none" when neither does."""
    errors: dict[str, str | None] = {"namespaces": None, "landlock": None}
    for variant in _VARIANTS:
        if variant[0] and not runtime.root:
            continue
        chosen = await _try(runtime, builder, "namespaces", variant, errors)
        if chosen is not None:
            return chosen
    chosen = await _try(runtime, builder, "landlock", (False, True), errors)
    if chosen is not None:
        return chosen
    none = dataclasses.replace(
        runtime,
        tier="none",
        namespaces_error=errors["namespaces"],
        landlock_tier_error=errors["landlock"],
    )
    builder.runtime = none
    return none


async def _try(
    runtime: Runtime,
    builder: EnvelopeBuilder,
    tier: Tier,
    variant: tuple[bool, bool],
    errors: dict[str, str | None],
) -> Runtime | None:
    """The runtime in ``tier`` if its base canary runs; else None, the first error kept."""
    why = None
    if runtime.landlock_abi < 1:
        why = runtime.landlock_error or "Landlock is not available"
    elif not runtime.seccomp:
        why = "seccomp filters are not available (install libseccomp2)"
    elif tier == "landlock" and not runtime.root and runtime.landlock_abi < SCOPES_ABI:
        why = (
            f"Landlock ABI {runtime.landlock_abi} has no scopes (ABI {SCOPES_ABI}, Linux "
            "6.12): without namespaces an action of the connector's own uid could signal it"
        )
    candidate = dataclasses.replace(
        runtime,
        tier=tier,
        userns_for_root=variant[0],
        fresh_proc=variant[1],
        namespaces_error=errors["namespaces"],
        landlock_tier_error=None,
    )
    if why is None:
        builder.runtime = candidate
        why = await Canaries(builder).check(BASE)
    if why is None:
        return candidate
    errors[tier] = errors[tier] or why
    return None
