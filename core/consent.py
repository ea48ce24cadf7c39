"""Core's sensitivity/consent policy, applied before dispatch (seed 048's responsibility
split: core "applies sensitivity/consent policy", then dispatches).

An action's sensitivity is its class's baseline (C6: the strictest of the categories
it composes) raised by its declaration's ``sensitivity`` (``shared/sensitivity.py``).
Up to ``consent.max_sensitivity_without_consent`` any caller granted the action may
trigger it; above, the directive must carry ``consent/sensitivity`` naming a class at
least as strict — the issuer's explicit consent, signed with the directive when it is
signed — or core refuses with ``consent-required`` and nothing runs.
"""

from __future__ import annotations

from sensorium.shared.config import ConsentConfig
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.sensitivity import effective_sensitivity, rank
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.report import ConnectorAction


def action_sensitivity(action: ConnectorAction) -> str:
    """The sensitivity a run of ``action`` has, from the facts its catalog entry states."""
    return effective_sensitivity(action.class_, action.composed_effects, action.sensitivity_class)


def check_consent(d: Directive, action: ConnectorAction, policy: ConsentConfig) -> None:
    """Nothing when ``d`` may trigger ``action``; ``CodedError(consent-required)`` otherwise."""
    needed = action_sensitivity(action)
    allowed = policy.max_sensitivity_without_consent
    if rank(needed) <= rank(allowed):
        return
    given = d.consent_sensitivity
    if given is not None and rank(given) >= rank(needed):
        return
    told = f"consent/sensitivity {given!r} does not reach it" if given else "no consent was given"
    raise CodedError(
        RuntimeErrorCode.CONSENT_REQUIRED,
        f"{d.action_id} is {needed}, above what this node lets a caller trigger without "
        f"consent ({allowed}), and {told}; send consent/sensitivity: {needed!r} to "
        "consent explicitly",
        path="$.consent/sensitivity",
        detail={"sensitivity": needed, "allowed": allowed},
    )
