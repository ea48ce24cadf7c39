"""What this host lets the connector enforce, found by building real sandboxes.

The same canaries the connector runs at start, here in a scratch state directory:
the tier, every mechanism the envelopes rely on, each class's verdict, and for
whatever is missing the change that would bring it back. Runs as whoever calls it,
so run it as the user the node runs as.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from sensorium.connectors.os.envelope.builder import EnvelopeBuilder
from sensorium.connectors.os.envelope.canary import BASE, Canaries, choose_tier
from sensorium.connectors.os.envelope.probe import (
    CONTAINER_FIX,
    SCOPES_ABI,
    Runtime,
    userns_setting,
)
from sensorium.connectors.os.run.sandbox.spawner import Spawner
from sensorium.shared.config import NodeConfig, SandboxConfig
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.fs_policy import FsPolicy

CLASSES = (
    "read-only-spawn",
    "allowlisted-script",
    "scoped-fs-write",
    "egress-network-spawn",
    "artifact-producing-spawn",
)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    # A failed blocking check fails the diagnosis even when every class's canary ran.
    blocking: bool = False


@dataclass
class Diagnosis:
    uid: int
    tier: str
    checks: list[Check] = field(default_factory=list)
    # class -> None when its canary ran; else why not
    classes: dict[str, str | None] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return all(v is None for v in self.classes.values()) and not any(
            c.blocking and not c.ok for c in self.checks
        )


def _decl(cls: str, write_root: str) -> Declaration:
    blocks: dict[str, dict[str, object]] = {
        "scoped-fs-write": {
            "fs_write": {
                "write_root": write_root,
                "max_bytes_total": 4096,
                "max_bytes_per_file": 4096,
            }
        },
        "egress-network-spawn": {
            "egress_network": {
                "endpoints": [{"host": "localhost", "port": 9, "protocol": "tcp"}],
                "max_bytes_total": 4096,
                "max_bytes_per_connection": 1024,
            }
        },
        "artifact-producing-spawn": {
            "artifact": {
                "max_count": 1,
                "max_bytes_per": 16,
                "max_bytes_total": 16,
                "allowed_media_types": ["text/plain"],
            }
        },
    }
    doc = {**msgspec.to_builtins(BASE), "class": cls, **blocks.get(cls, {})}
    doc["action_id"] = f"doctor.{cls}"
    return msgspec.convert(doc, type=Declaration)


def _file_checks(rt: Runtime) -> list[Check]:
    checks = [
        Check(
            "running uid",
            True,
            "root: actions run as the sandbox uid"
            if rt.root
            else f"uid {os.getuid()}: actions run in an unprivileged user namespace",
        )
    ]
    why = userns_setting()
    checks.append(
        Check(
            "unprivileged user namespaces",
            rt.root or why is None,
            "not needed as root" if rt.root else (why or "allowed by the host's settings"),
            None if rt.root or why is None else why.split(": ", 1)[-1],
        )
    )
    checks.append(
        Check(
            f"Landlock (ABI {rt.landlock_abi})",
            rt.landlock_abi >= 1,
            rt.landlock_error
            or ("signal and abstract-socket scopes" if rt.landlock_abi >= SCOPES_ABI else "")
            or "filesystem rules",
            None if rt.landlock_abi >= 1 else CONTAINER_FIX,
        )
    )
    checks.append(
        Check(
            "seccomp",
            rt.seccomp,
            "filter mode and libseccomp" if rt.seccomp else "not available",
            None if rt.seccomp else "install libseccomp2 (apt-get install libseccomp2)",
        )
    )
    checks.append(
        Check(
            "overlayfs",
            rt.overlay,
            "listed in /proc/filesystems" if rt.overlay else "not in this kernel",
            None if rt.overlay else "load it (modprobe overlay); C3 needs it",
        )
    )
    try:
        import magic  # noqa: F401

        checks.append(Check("libmagic", True, "media types of C5 artifacts are sniffed"))
    except (ImportError, OSError) as exc:
        checks.append(
            Check("libmagic", False, str(exc), "install libmagic1 (apt-get install libmagic1)")
        )
    checks.append(_exec_stage())
    cgroup2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    checks.append(
        Check(
            "cgroup v2",
            True,
            "unified hierarchy (not used by the envelopes yet)"
            if cgroup2
            else "v1 or hybrid (not used by the envelopes yet: rlimits cap each action)",
        )
    )
    return checks


def _exec_stage() -> Check:
    """Whether sandboxes end in the compiled exec stage here (a speed matter only)."""
    from sensorium.connectors.os.run.sandbox import execstage

    stage = execstage.open_stage()
    if stage is not None:
        os.close(stage.fd)
        return Check("exec stage", True, f"{stage.path} runs: no interpreter before exec")
    return Check(
        "exec stage",
        True,
        "not built or not runnable here: sandboxes take the Python path (same steps, "
        "~1-2 ms slower per spawn)",
        "reinstall with a C compiler present (apt-get install gcc) unless "
        f"{execstage.ENV_SWITCH}=off is meant",
    )


# sandbox.* -> (the rlimit it sets for each action, the unit's directive that raises it)
RLIMITS = {
    "max_open_files": (resource.RLIMIT_NOFILE, "LimitNOFILE="),
    "max_processes": (resource.RLIMIT_NPROC, "LimitNPROC="),
    "max_memory_bytes": (resource.RLIMIT_DATA, "LimitDATA="),
}
CAP_SYS_RESOURCE = 24


def has_cap_sys_resource() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError):
        pass
    return False


def rlimit_check(
    sb: SandboxConfig,
    *,
    can_raise: bool,
    userns: bool = True,
    getrlimit: Callable[[int], tuple[int, int]] = resource.getrlimit,
) -> Check:
    """Each action's rlimits are set to sandbox.max_open_files / max_processes /
    max_memory_bytes (soft = hard). Above this process's hard limit that needs
    CAP_SYS_RESOURCE in the host's user namespace, which no action built in a user
    namespace has (nor the systemd unit): its setrlimit fails and the action does not
    start. ``can_raise``: the capability is held and applies (no user namespace);
    ``userns``: actions get their rlimits inside a user namespace."""
    over: list[tuple[str, int, int, str]] = []
    for key, (which, directive) in RLIMITS.items():
        wanted = int(getattr(sb, key))
        hard = int(getrlimit(which)[1])
        if hard != resource.RLIM_INFINITY and wanted > hard:
            over.append((key, wanted, hard, directive))
    name = "action rlimits"
    if not over:
        return Check(name, True, "sandbox.* within this process's hard limits")
    said = ", ".join(f"sandbox.{k} = {w} > hard limit {h}" for k, w, h, _ in over)
    if can_raise:
        return Check(name, True, f"{said}: raised with CAP_SYS_RESOURCE")
    directives = "/".join(d for *_, d in over)
    keys = "/".join(f"sandbox.{k}" for k, *_ in over)
    return Check(
        name,
        False,
        f"{said}, and "
        + (
            "no capability raises a hard limit inside an action's user namespace"
            if userns
            else "this process has no CAP_SYS_RESOURCE to raise it"
        )
        + ": every action would fail to start",
        f"raise {directives} in the unit (or `ulimit -H` where the node starts), or "
        f"lower {keys} in node.json",
        blocking=True,
    )


async def diagnose(cfg: NodeConfig | None = None) -> Diagnosis:
    """Build the envelopes for real, in a throwaway state directory."""
    work = Path(tempfile.mkdtemp(prefix="sensorium-doctor-"))
    write_root = Path(tempfile.mkdtemp(prefix="sensorium-doctor-wr-", dir="/var/tmp"))
    spawner = Spawner()
    spawner.start()
    try:
        paths = StatePaths(work)
        paths.ensure()
        rt = Runtime.read()
        builder = EnvelopeBuilder(paths, NodeConfig(), rt, FsPolicy(schemaVersion=2), spawner)
        builder.start()
        rt = await choose_tier(rt, builder)
        diagnosis = Diagnosis(uid=os.getuid(), tier=rt.tier, checks=_file_checks(rt))
        ns_ok = rt.tier == "namespaces"
        # An action's rlimits are set inside its user namespace, if it has one.
        userns = rt.tier == "namespaces" and (not rt.root or rt.userns_for_root)
        diagnosis.checks.append(
            rlimit_check(
                (cfg or NodeConfig()).sandbox,
                can_raise=not userns and has_cap_sys_resource(),
                userns=userns,
            )
        )
        diagnosis.checks.append(
            Check(
                "namespaces (user, mount, pid, net, ipc, uts)",
                ns_ok,
                "a canary ran in them" if ns_ok else (rt.namespaces_error or "not tried"),
                None if ns_ok else (userns_setting() or CONTAINER_FIX),
            )
        )
        canaries = Canaries(builder)
        for cls in CLASSES:
            state, gaps = rt.class_state(cls)
            if state != "enabled":
                diagnosis.classes[cls] = gaps[0] if gaps else state
                continue
            diagnosis.classes[cls] = await canaries.check(_decl(cls, str(write_root)))
        return diagnosis
    finally:
        spawner.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(write_root, ignore_errors=True)


def run(cfg: NodeConfig | None = None) -> Diagnosis:
    """``cfg``: the node's configuration, whose sandbox.* limits are checked."""
    return asyncio.run(diagnose(cfg))
