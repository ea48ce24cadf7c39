"""What this connector can enforce, per action class, on this node.

The answer goes into the module report and from there into the capability
ledger: a class runs only where its envelope is enforced, and a class that runs
with a known gap says so (DESIGN §6). The kernel facts are read once at start,
and then one real sandbox is built and run (``/bin/true`` under the full C1
envelope): a mechanism that exists on paper but fails here (a container that
forbids ``unshare``, a seccomp-less kernel) is found before any action runs.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

from sensorium.connectors.os.sandbox import landlock, seccomp
from sensorium.shared.wire.report import LedgerState, RuntimeProbe

# When no sandbox can be built, C1 still runs on the spawn baseline alone.
C1_GAPS = (
    "no filesystem confinement: the action reads whatever the connector's user can read",
    "no egress isolation: the action can reach the network",
    "descendants that leave the process group (setsid) are found by parentage only, "
    "not by a PID namespace",
)
_BASELINE = {
    "new-session-and-process-group": True,
    "curated-environment": True,
    "stdin-devnull-no-tty": True,
    "fds-0-2-only": True,
    "rlimit-core-0": True,
    "no-new-privs": True,
    "wall-clock-timeout": True,
    "capped-capture": True,
}


def _overlay_known() -> bool:
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1] == "overlay" for line in f if line.strip())
    except OSError:
        return False


def _userns_possible() -> bool:
    try:
        with open("/proc/sys/user/max_user_namespaces") as f:
            return int(f.read()) > 0
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class Runtime:
    """The kernel facts of this node and whether a full sandbox was built here."""

    root: bool
    landlock_abi: int
    seccomp: bool
    overlay: bool
    userns: bool
    # None when the trial sandbox ran; otherwise why it could not be built.
    trial_error: str | None = "not tried"
    gaps: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def read(cls) -> Runtime:
        return cls(
            root=os.geteuid() == 0,
            landlock_abi=landlock.abi_version(),
            seccomp=seccomp.available(),
            overlay=_overlay_known(),
            userns=_userns_possible(),
        )

    @property
    def namespaces(self) -> bool:
        """Mount, PID, network, IPC and UTS namespaces can be made for an action."""
        return self.root or self.userns

    @property
    def sandbox(self) -> bool:
        """The full universal envelope can be built: every class but C1 needs it."""
        return (
            self.trial_error is None and self.namespaces and self.landlock_abi >= 1 and self.seccomp
        )

    def why_not(self) -> str:
        if self.trial_error is not None:
            return f"the trial sandbox failed: {self.trial_error}"
        if not self.namespaces:
            return "no namespaces: not root and user namespaces are disabled"
        if self.landlock_abi < 1:
            return "Landlock is not available in this kernel"
        if not self.seccomp:
            return "seccomp filters are not available"
        return "the sandbox is available"

    def mechanisms(self) -> dict[str, bool]:
        ok = self.trial_error is None
        return {
            **_BASELINE,
            "landlock": self.landlock_abi >= 1 and ok,
            "landlock-net": self.landlock_abi >= 4 and ok,
            "landlock-scopes": self.landlock_abi >= 6 and ok,
            "seccomp": self.seccomp and ok,
            "pid-namespace": self.namespaces and ok,
            "net-namespace": self.namespaces and ok,
            "mount-namespace": self.namespaces and ok,
            "user-namespace": (not self.root) and self.userns and ok,
            "unprivileged-uid": self.namespaces and ok,
            "overlay": self.overlay and self.root and ok,
            "host-tmpfs": self.root,
        }

    def class_state(self, action_class: str) -> tuple[LedgerState, list[str]]:
        """The ledger state this runtime can give a class, and the gaps it must state."""
        if action_class == "read-only-spawn":
            if self.sandbox:
                return "enabled", []
            if self.root:
                # Without the sandbox there is no uid drop: the action would run as root.
                return "unsupported_by_runtime", [
                    f"the connector runs as root and {self.why_not()}; an action would run "
                    "as root, so none runs"
                ]
            return "degraded", [*C1_GAPS, self.why_not()]
        if not self.sandbox:
            return "unsupported_by_runtime", [
                f"class {action_class} needs the kernel sandbox and {self.why_not()}; "
                "it will not run unenforced"
            ]
        if action_class in ("scoped-fs-write", "artifact-producing-spawn") and not self.root:
            return "unsupported_by_runtime", [
                f"class {action_class} needs a capped tmpfs the connector can still read "
                "after the action's namespace is gone, which takes root"
            ]
        if action_class == "scoped-fs-write" and not self.overlay:
            return "unsupported_by_runtime", ["overlayfs is not available in this kernel"]
        return "enabled", []

    def report(self, classes: list[str]) -> RuntimeProbe:
        return RuntimeProbe(
            platform=f"{platform.system()} {platform.release()}",
            uid=os.getuid(),
            mechanisms=self.mechanisms(),
            classes={c: self.class_state(c)[0] for c in classes},
        )
