"""What this connector can enforce, per action class, on this node.

The answer goes into the module report and from there into the capability
ledger: a class runs only where its envelope is enforced, and a class that runs
with a known gap says so (DESIGN §6). This runtime enforces the universal spawn
baseline; the kernel envelopes (Landlock, namespaces, seccomp, overlay) that
complete C1 and make C2–C6 possible are not wired in yet, so they are reported
as absent rather than pretended.
"""

from __future__ import annotations

import os
import platform
from typing import get_args

from sensorium.shared.wire.declaration import ActionClass
from sensorium.shared.wire.report import LedgerState, RuntimeProbe

C1_GAPS = (
    "no filesystem confinement: the action reads whatever the connector's user can read",
    "no egress isolation: the action can reach the network",
    "descendants that leave the process group (setsid) are found by parentage only, "
    "not by a PID namespace",
)
_ENFORCED = {
    "new-session-and-process-group": True,
    "curated-environment": True,
    "stdin-devnull-no-tty": True,
    "fds-0-2-only": True,
    "rlimit-core-0": True,
    "no-new-privs": True,
    "wall-clock-timeout": True,
    "capped-capture": True,
    "landlock": False,
    "pid-namespace": False,
    "net-namespace": False,
    "mount-namespace": False,
    "seccomp": False,
    "unprivileged-uid": False,
}


def class_state(action_class: str) -> tuple[LedgerState, list[str]]:
    """The ledger state this runtime can give a class, and the gaps it must state."""
    if action_class == "read-only-spawn":
        return "degraded", list(C1_GAPS)
    return "unsupported_by_runtime", [
        f"class {action_class} needs kernel envelopes this runtime does not enforce yet; "
        "it will not run unenforced"
    ]


def probe() -> RuntimeProbe:
    # Every class a declaration may name; operator-gated-spawn is reserved, never runnable.
    classes: dict[str, str] = {
        c: class_state(c)[0] for c in get_args(ActionClass) if c != "operator-gated-spawn"
    }
    return RuntimeProbe(
        platform=f"{platform.system()} {platform.release()}",
        uid=os.getuid(),
        mechanisms=dict(_ENFORCED),
        classes=classes,
    )
