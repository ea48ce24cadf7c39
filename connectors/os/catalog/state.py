"""The ledger state of one declaration on this node: its class's tier, its own gaps, its canary."""

from __future__ import annotations

from sensorium.connectors.os.envelope.builder import SCRATCH
from sensorium.connectors.os.envelope.classes import EFFECT_CLASS, effects
from sensorium.connectors.os.envelope.probe import Runtime
from sensorium.connectors.os.run.sandbox import darwin, fsprofile
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.fs_policy import FsPolicy
from sensorium.shared.wire.report import LedgerState


def action_state(
    decl: Declaration, runtime: Runtime, policy: FsPolicy, canary: str | None
) -> tuple[LedgerState, list[str]]:
    """The ledger state of one declaration here: its class's, narrowed by its own gaps
    and by its canary (``canary`` is None when a no-op ran under exactly its envelope)."""
    if (chosen := darwin.platform_state(decl, policy)) is not None:  # not Linux: macOS or refuse
        return chosen
    state, gaps = runtime.class_state(decl.class_)
    if decl.class_ == "composed-spawn" and state == "enabled":
        for effect in effects(decl)[1:]:
            state, gaps = runtime.class_state(EFFECT_CLASS[effect])
            if state != "enabled":
                break
    if state != "enabled":
        return state, gaps
    if decl.egress_network is not None and "egress-network" in effects(decl):
        from sensorium.connectors.os.effects.egress.relay import unsupported_endpoints

        unsupported = unsupported_endpoints(decl.egress_network)
        if unsupported:
            return "unsupported_by_runtime", unsupported
    try:
        plan = fsprofile.compile_read(
            fsprofile.effective_profile(policy, decl.fs_profile), base=SCRATCH
        )
    except fsprofile.PolicyError as exc:
        return "blocked_by_policy", [str(exc)]
    if canary is not None:
        return "unsupported_by_runtime", [
            f"the canary under this action's envelope failed: {canary}"
        ]
    if plan.unenforced and "deny-glob" not in decl.allow_fallback:
        # Fail closed (ADR-011): running it would show what the policy denies.
        return "unsupported_by_runtime", [
            *plan.unenforced,
            "the action does not run: narrow the fs profile, or declare allow_fallback: "
            '["deny-glob"] to run it with these files readable (then `degraded`)',
        ]
    if plan.unenforced:
        return "degraded", [f"allow_fallback deny-glob: {g}" for g in plan.unenforced]
    # Stricter than the policy (a mask wins, a directory hidden whole): enabled, noted.
    return "enabled", list(plan.gaps)
