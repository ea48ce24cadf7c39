"""Each action class's baseline incidental effects and sensitivity (seed 048, §Action
Class Catalog), and C6's composition of them.

The connector declares at least the baseline effects in every outcome and observation
(a declaration may add effects, never subtract); the baseline sensitivity is the least
an observation carries (a declaration may raise it, never lower it). A composed
action (C6) has the union of the baselines of the categories it names, and the
strictest of their sensitivities. Core ranks an action by the same facts before it
dispatches (``core/consent.py``).

    >>> baseline_effects("composed-spawn", ["scoped-fs-write", "egress-network"])
    ['disk-access-timestamp-update', 'local-filesystem-write', 'network-egress']
    >>> effective_sensitivity("egress-network-spawn", (), "private")
    'private'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sensorium.shared.wire.declaration import SENSITIVITY_CLASSES, SensitivityClass

CLASS_EFFECTS: dict[str, tuple[str, ...]] = {
    "read-only-spawn": ("disk-access-timestamp-update",),
    "allowlisted-script": ("disk-access-timestamp-update",),
    "scoped-fs-write": ("disk-access-timestamp-update", "local-filesystem-write"),
    "egress-network-spawn": ("network-egress",),
    "artifact-producing-spawn": ("disk-access-timestamp-update", "artifact-lane-write"),
}
CLASS_SENSITIVITY: dict[str, SensitivityClass] = {
    "read-only-spawn": "operational-sensitive",
    "allowlisted-script": "operational-sensitive",
    "scoped-fs-write": "operational-sensitive",
    "egress-network-spawn": "operational-sensitive",
    "artifact-producing-spawn": "operational-sensitive",
}
# C6's effect categories, each the class whose baselines it brings.
CATEGORY_CLASS: dict[str, str] = {
    "read": "read-only-spawn",
    "scoped-fs-write": "scoped-fs-write",
    "egress-network": "egress-network-spawn",
    "artifact-produce": "artifact-producing-spawn",
}
STRICTEST: SensitivityClass = SENSITIVITY_CLASSES[-1]


def rank(sensitivity: str) -> int:
    """Its place in the published order, least restrictive first; a class outside the
    published five ranks as the strictest (it cannot be shown to be less)."""
    order: tuple[str, ...] = SENSITIVITY_CLASSES
    return order.index(sensitivity) if sensitivity in order else len(order) - 1


def strictest(classes: Iterable[str]) -> SensitivityClass:
    """The most restrictive of ``classes`` (none: the strictest of all, failing closed)."""
    ranks = [rank(c) for c in classes]
    return SENSITIVITY_CLASSES[max(ranks)] if ranks else STRICTEST


def included_classes(class_: str, composed: Sequence[str] | None = ()) -> list[str]:
    """The classes whose baselines apply: C6's named categories, else the class itself."""
    if class_ == "composed-spawn":
        return [CATEGORY_CLASS[c] for c in dict.fromkeys(composed or ()) if c in CATEGORY_CLASS]
    return [class_]


def baseline_effects(class_: str, composed: Sequence[str] | None = ()) -> list[str]:
    """The incidental effects every outcome of the class declares, in catalog order."""
    found: dict[str, None] = {}
    for included in included_classes(class_, composed):
        found.update(dict.fromkeys(CLASS_EFFECTS.get(included, ())))
    return list(found)


def baseline_sensitivity(class_: str, composed: Sequence[str] | None = ()) -> SensitivityClass:
    """The class's baseline; C6's is the strictest of its categories'. A class without
    one (C7, reserved) is the strictest: nothing ranks it lower."""
    included = included_classes(class_, composed)
    if not included or any(c not in CLASS_SENSITIVITY for c in included):
        return STRICTEST
    return strictest(CLASS_SENSITIVITY[c] for c in included)


def effective_sensitivity(
    class_: str, composed: Sequence[str] | None, declared: str | None
) -> SensitivityClass:
    """The baseline, raised (never lowered) by the class the declaration names."""
    baseline = baseline_sensitivity(class_, composed)
    if declared is None or declared not in SENSITIVITY_CLASSES:
        return baseline
    return strictest((baseline, declared))
