"""What this connector can enforce on this node: the kernel facts and the tier they leave.

Two tiers (DESIGN §6). **namespaces**: every action gets its own user (when the
connector is not root), mount, PID, network, IPC and UTS namespaces, on top of
Landlock, seccomp and rlimits; every class can run. **landlock**: namespaces are
refused (a container's default seccomp profile, user namespaces switched off), but
Landlock and seccomp work; the read-only classes run fully enforced without
namespaces, the others are refused with the option that would enable them.

The feature probe here only explains; the canaries (``canary.py``) decide: an
action is enabled only when a no-op ran under exactly its envelope.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Literal

from sensorium.connectors.os.run.sandbox import landlock, seccomp
from sensorium.shared.wire.report import LedgerState, RuntimeProbe

Tier = Literal["namespaces", "landlock", "none"]
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
# Classes the landlock tier enforces whole; the rest need a namespace of their own.
LANDLOCK_TIER_CLASSES = ("read-only-spawn", "allowlisted-script")
# Landlock scopes (signals, abstract unix sockets) arrived in ABI 6: without a PID
# namespace they are what keeps an action of the connector's own uid off its processes.
SCOPES_ABI = 6
_NEEDS = {
    "scoped-fs-write": "a mount namespace (its overlay and capped upper layer)",
    "egress-network-spawn": "a network namespace (its relay and DNS stub)",
    "artifact-producing-spawn": "a mount namespace (its capped artifact tmpfs)",
}


CONTAINER_FIX = (
    "in a container, run it with --security-opt unmask=/proc/* (Podman), and with Docker "
    "also --security-opt seccomp=deploy/container/seccomp.json (its default profile "
    "refuses unshare and mount); see deploy/container/README.md"
)


def in_container() -> bool:
    """Podman, Docker and systemd-nspawn each leave a mark."""
    return (
        os.path.exists("/run/.containerenv")
        or os.path.exists("/.dockerenv")
        or bool(os.environ.get("container"))  # noqa: SIM112 - systemd-nspawn sets it lowercase
    )


def needs(action_class: str) -> str:
    """What a class needs beyond the landlock tier."""
    return _NEEDS.get(action_class, "namespaces")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _overlay_known() -> bool:
    text = _read("/proc/filesystems") or ""
    return any(line.split()[-1] == "overlay" for line in text.splitlines() if line.strip())


def userns_setting() -> str | None:
    """The host setting that forbids unprivileged user namespaces, named; None if none does."""
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return (
            "user.max_user_namespaces=0: set it above 0 (sysctl -w user.max_user_namespaces=15000)"
        )
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return "kernel.unprivileged_userns_clone=0: sysctl -w kernel.unprivileged_userns_clone=1"
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return (
            "kernel.apparmor_restrict_unprivileged_userns=1 (Ubuntu 24.04): install "
            "deploy/apparmor/sensorium (it permits user namespaces to this node's python), "
            "or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
        )
    return None


@dataclass(frozen=True)
class Runtime:
    """The kernel facts of this node, and the tier the base canary proved."""

    root: bool
    landlock_abi: int
    seccomp: bool
    overlay: bool
    landlock_error: str | None = None
    userns_error: str | None = None
    # The tier the base canary ran in; "none" until it ran.
    tier: Tier = "none"
    # Why the namespace tier's base canary failed, when it did.
    namespaces_error: str | None = "not tried"
    # Why the landlock tier's base canary failed, when it was tried and did.
    landlock_tier_error: str | None = None
    # Namespace tier variants a container may need: a root connector that must go
    # through a user namespace (no CAP_SYS_ADMIN of its own), and no fresh procfs
    # (a container's masked /proc refuses one; the host's then stays, read-only).
    userns_for_root: bool = False
    fresh_proc: bool = True

    @classmethod
    def read(cls) -> Runtime:
        """Never raises: every refusal only marks a mechanism unavailable."""
        abi, why = landlock.probe()
        root = os.geteuid() == 0
        return cls(
            root=root,
            landlock_abi=abi,
            landlock_error=why,
            seccomp=seccomp.available(),
            overlay=_overlay_known(),
            userns_error=None if root else userns_setting(),
        )

    @property
    def sandbox(self) -> bool:
        return self.tier != "none"

    def why_not(self) -> str:
        """Why the namespace tier is not in force (for the landlock tier and none)."""
        reasons = []
        if self.landlock_abi < 1:
            reasons.append(self.landlock_error or "Landlock is not available")
        if not self.seccomp:
            reasons.append("seccomp filters are not available (install libseccomp2)")
        if self.userns_error:
            reasons.append(f"user namespaces are restricted by {self.userns_error}")
        for label, error in (
            ("namespaces", self.namespaces_error),
            ("landlock tier", self.landlock_tier_error),
        ):
            # A reason already given (Landlock refused fails both tiers) is said once.
            if error and error != "not tried" and not any(error in r for r in reasons):
                reasons.append(f"{label}: {error}")
        if reasons and in_container():
            reasons.append(CONTAINER_FIX)
        return "; ".join(reasons) or "the sandbox is available"

    def mechanisms(self) -> dict[str, bool]:
        ns = self.tier == "namespaces"
        on = self.tier != "none"
        return {
            **_BASELINE,
            "landlock": self.landlock_abi >= 1 and on,
            "landlock-net": self.landlock_abi >= 4 and on,
            "landlock-scopes": self.landlock_abi >= SCOPES_ABI and on,
            "seccomp": self.seccomp and on,
            "pid-namespace": ns,
            "net-namespace": ns,
            "mount-namespace": ns,
            "user-namespace": ns and (not self.root or self.userns_for_root),
            "fresh-procfs": ns and self.fresh_proc,
            "unprivileged-uid": on,
            "overlay": self.overlay and ns,
        }

    def class_state(self, action_class: str) -> tuple[LedgerState, list[str]]:
        """The ledger state this runtime can give a class, and why when not enabled."""
        if self.tier == "namespaces":
            if action_class == "scoped-fs-write" and not self.overlay:
                return "unsupported_by_runtime", ["overlayfs is not available in this kernel"]
            return "enabled", []
        if self.tier == "landlock" and action_class in LANDLOCK_TIER_CLASSES:
            return "enabled", []
        if self.tier == "landlock":
            need = needs(action_class)
            return "unsupported_by_runtime", [
                f"class {action_class} needs {need}, which this host refuses ({self.why_not()}); "
                "it will not run unenforced. Run `sensorium doctor` for the fix"
            ]
        return "unsupported_by_runtime", [
            f"class {action_class} needs the kernel sandbox, which cannot be built here "
            f"({self.why_not()}); it will not run unenforced. Run `sensorium doctor` for the fix"
        ]

    def report(self, classes: list[str]) -> RuntimeProbe:
        return RuntimeProbe(
            platform=f"{platform.system()} {platform.release()}",
            uid=os.getuid(),
            mechanisms=self.mechanisms(),
            classes={c: self.class_state(c)[0] for c in classes},
        )
