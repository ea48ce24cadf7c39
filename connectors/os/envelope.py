"""One action's envelope: turn a declaration into a sandbox plan, and its run into results.

A class is a set of effects (``read`` always; C3 adds ``scoped-fs-write``, C4
``egress-network``, C5 ``artifact-produce``; C6 names its own), and every effect
adds its mechanism to one plan, so C6 is the union of the others by
construction and an effect not named gets no mechanism at all — it is denied.

Inside the sandbox the action sees a private, capped tmpfs at ``/tmp`` as its
scratch and working directory (gone with its namespace), its write root (C3, an
overlay whose upper layer is a capped tmpfs) and ``/tmp/artifacts`` (C5, a
capped tmpfs the connector promotes from after exit).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sensorium.connectors.os.argv import render
from sensorium.connectors.os.baseline import child_env
from sensorium.connectors.os.launcher import Sandbox, SpawnSpec
from sensorium.connectors.os.probe import Runtime
from sensorium.connectors.os.sandbox import fsprofile
from sensorium.connectors.os.sandbox import namespaces as ns
from sensorium.connectors.os.sandbox.plan import Egress, Landlock, Mount, Plan
from sensorium.connectors.os.sandbox.script import SCRIPT_FD, SCRIPT_PATH, seal
from sensorium.connectors.os.sandbox.spawner import Spawner
from sensorium.shared.config import NodeConfig
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.fs_policy import FsPolicy
from sensorium.shared.wire.report import LedgerState

if TYPE_CHECKING:
    from sensorium.connectors.os.effects import EgressSession

SCRATCH = "/tmp"
ARTIFACT_DIR = "/tmp/artifacts"
PTS = "/dev/pts"
NAMESPACES = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWNET | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS
# Devices every program expects; nothing else under /dev is granted by the baseline.
DEVICES_READ = ("/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")
DEVICES_FULL = ("/dev/null",)
# Room for a tmpfs's own directories beside its capped contents.
TMPFS_SLACK = 256 * 1024

CLASS_EFFECTS: dict[str, tuple[str, ...]] = {
    "read-only-spawn": ("read",),
    "allowlisted-script": ("read",),
    "scoped-fs-write": ("read", "scoped-fs-write"),
    "egress-network-spawn": ("read", "egress-network"),
    "artifact-producing-spawn": ("read", "artifact-produce"),
}
_EFFECT_CLASS = {
    "scoped-fs-write": "scoped-fs-write",
    "egress-network": "egress-network-spawn",
    "artifact-produce": "artifact-producing-spawn",
}


def effects(decl: Declaration) -> tuple[str, ...]:
    if decl.class_ == "composed-spawn" and decl.composed is not None:
        return ("read", *(e for e in decl.composed.effects if e != "read"))
    return CLASS_EFFECTS.get(decl.class_, ("read",))


def action_state(
    decl: Declaration, runtime: Runtime, policy: FsPolicy
) -> tuple[LedgerState, list[str]]:
    """The ledger state of one declaration here: its class's, narrowed by its own gaps."""
    state, gaps = runtime.class_state(decl.class_)
    if decl.class_ == "composed-spawn" and state == "enabled":
        for effect in effects(decl)[1:]:
            state, gaps = runtime.class_state(_EFFECT_CLASS[effect])
            if state != "enabled":
                break
    if state != "enabled" or not runtime.sandbox:
        return state, gaps
    if decl.egress_network is not None and "egress-network" in effects(decl):
        from sensorium.connectors.os.egress.relay import unsupported_protocols

        udp = unsupported_protocols(decl.egress_network)
        if udp:
            return "unsupported_by_runtime", udp
    try:
        plan = fsprofile.compile_read(
            fsprofile.effective_profile(policy, decl.fs_profile), base=SCRATCH
        )
    except fsprofile.PolicyError as exc:
        return "blocked_by_policy", [str(exc)]
    if plan.gaps:
        return "degraded", list(plan.gaps)
    return "enabled", []


@dataclass
class Prepared:
    """Everything one invocation set up, to be torn down whatever happens."""

    spec: SpawnSpec
    argv: list[str]
    sandbox: Sandbox | None
    host_mounts: list[Path] = field(default_factory=list)
    host_dirs: list[Path] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    upper: Path | None = None
    artifacts: Path | None = None
    egress: EgressSession | None = None

    def cleanup(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        for mount in reversed(self.host_mounts):
            with contextlib.suppress(OSError):
                ns.umount(str(mount))
        self.host_mounts.clear()
        for d in reversed(self.host_dirs):
            shutil.rmtree(d, ignore_errors=True)
        self.host_dirs.clear()


class EnvelopeBuilder:
    """Builds each invocation's plan from the declaration, the fs policy and this node."""

    def __init__(
        self,
        paths: StatePaths,
        cfg: NodeConfig,
        runtime: Runtime,
        policy: FsPolicy,
        spawner: Spawner | None,
    ) -> None:
        self.paths = paths
        self.cfg = cfg
        self.runtime = runtime
        self.policy = policy
        self.spawner = spawner
        self.work = paths.run / "envelopes"
        self.empty_file = self.work / "empty"

    def __repr__(self) -> str:
        return f"<EnvelopeBuilder sandbox={self.runtime.sandbox} spawner={self.spawner!r}>"

    def start(self) -> None:
        """Clear what a killed connector left behind, and make the masking source."""
        if self.work.is_dir():
            for entry in self.work.iterdir():
                if entry.is_dir():
                    for mountpoint in ("mnt", "artifacts"):
                        with contextlib.suppress(OSError):
                            ns.umount(str(entry / mountpoint))
                    shutil.rmtree(entry, ignore_errors=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.empty_file.write_bytes(b"")
        self.empty_file.chmod(0o444)

    def prepare(
        self, decl: Declaration, parameters: dict[str, object], run_id: str, timeout_s: float
    ) -> Prepared:
        """Raises RenderError, ScriptError or OSError; the caller maps them to codes."""
        if self.spawner is None or not self.runtime.sandbox:
            return self._baseline_only(decl, parameters, run_id, timeout_s)
        prepared = Prepared(spec=None, argv=[], sandbox=None)  # type: ignore[arg-type]
        try:
            self._prepare_sandboxed(prepared, decl, parameters, run_id, timeout_s)
        except BaseException:
            prepared.cleanup()
            raise
        return prepared

    def _spec(
        self, decl: Declaration, argv: list[str], cwd: str, timeout_s: float, executable: str
    ) -> SpawnSpec:
        return SpawnSpec(
            executable=executable,
            argv=argv,
            env=child_env(decl.environment.inherit, decl.environment.set, cwd),
            cwd=cwd,
            timeout_s=timeout_s,
            stdout_cap=decl.limits.stdout_max_bytes,
            stderr_cap=decl.limits.stderr_max_bytes,
            grace_s=self.cfg.limits.sigterm_grace_s,
        )

    def _baseline_only(
        self, decl: Declaration, parameters: dict[str, object], run_id: str, timeout_s: float
    ) -> Prepared:
        scratch = self.paths.scratch / run_id
        argv = render(decl.executable.argv_shape, parameters, {"scratch": str(scratch)})
        scratch.mkdir(mode=0o700)
        exe = decl.executable.interpreter or decl.executable.path
        return Prepared(
            spec=self._spec(decl, argv, str(scratch), timeout_s, exe),
            argv=argv,
            sandbox=None,
            host_dirs=[scratch],
        )

    def _host_tmpfs(self, prepared: Prepared, run_dir: Path, name: str, size: int) -> Path:
        """A capped tmpfs in the connector's own namespace: readable after the action's dies."""
        target = run_dir / name
        target.mkdir(mode=0o700)
        ns.tmpfs(str(target), size_bytes=size + TMPFS_SLACK, mode=0o755)
        prepared.host_mounts.append(target)
        return target

    def _prepare_sandboxed(
        self,
        prepared: Prepared,
        decl: Declaration,
        parameters: dict[str, object],
        run_id: str,
        timeout_s: float,
    ) -> None:
        sb = self.cfg.sandbox
        root = self.runtime.root
        uid, gid = (sb.uid, sb.gid) if root else (os.getuid(), os.getgid())
        fx = effects(decl)
        values = {"scratch": SCRATCH}
        # Mounts whose targets lie outside the scratch first; the scratch tmpfs then
        # covers the host's /tmp, and what goes inside the scratch comes after it.
        # No terminal of the host's, not even to read (no class permits a TTY).
        mounts: list[Mount] = (
            [Mount(kind="tmpfs", target=PTS, size_bytes=4096, mode=0o555, read_only=True)]
            if os.path.isdir(PTS)
            else []
        )
        inside: list[Mount] = []
        full = [SCRATCH, *DEVICES_FULL]
        base = SCRATCH
        run_dir = self.work / run_id
        if "scoped-fs-write" in fx or "artifact-produce" in fx:
            run_dir.mkdir(mode=0o700)
            prepared.host_dirs.append(run_dir)
        if "scoped-fs-write" in fx:
            assert decl.fs_write is not None
            w = decl.fs_write
            layer = self._host_tmpfs(prepared, run_dir, "mnt", w.max_bytes_total)
            upper, work = layer / "upper", layer / "work"
            upper.mkdir(mode=0o755)
            work.mkdir(mode=0o700)
            os.chown(upper, uid, gid)
            prepared.upper = upper
            mounts.append(
                Mount(
                    kind="overlay",
                    target=w.write_root,
                    writable=str(layer),
                    # No redirects, no metadata-only copy-up: every change the action
                    # makes is whole in the upper layer, where the commit reads it.
                    options=(
                        f"lowerdir={w.write_root},upperdir={upper},workdir={work},"
                        "redirect_dir=off,metacopy=off"
                    ),
                )
            )
            full.append(w.write_root)
            values["write_root"] = w.write_root
            base = w.write_root
        if "artifact-produce" in fx:
            assert decl.artifact is not None
            out = self._host_tmpfs(prepared, run_dir, "artifacts", decl.artifact.max_bytes_total)
            os.chown(out, uid, gid)
            prepared.artifacts = out
            inside.append(Mount(kind="mkdir", target=ARTIFACT_DIR, mode=0o700, uid=uid, gid=gid))
            inside.append(Mount(kind="bind", source=str(out), target=ARTIFACT_DIR, read_only=False))
            values["artifact_dir"] = ARTIFACT_DIR
        profile = fsprofile.effective_profile(self.policy, decl.fs_profile)
        reads = fsprofile.compile_read(profile, base=base)
        for masked in reads.masks:
            if os.path.isdir(masked):
                mounts.append(
                    Mount(kind="tmpfs", target=masked, size_bytes=4096, mode=0, read_only=True)
                )
            elif os.path.lexists(masked):
                mounts.append(Mount(kind="bind", source=str(self.empty_file), target=masked))
        scratch = Mount(
            kind="tmpfs",
            target=SCRATCH,
            size_bytes=sb.scratch_max_bytes,
            mode=0o700,
            uid=uid,
            gid=gid,
        )
        executable = decl.executable.interpreter or decl.executable.path
        read = [*reads.grants, executable, *DEVICES_READ]
        argv = render(decl.executable.argv_shape, parameters, values)
        exec_fd = None
        if decl.class_ == "allowlisted-script":
            assert decl.script is not None
            sealed = seal(decl.executable.path, decl.script.allowed_roots, decl.executable.sha256)
            prepared.fds.append(sealed.fd)
            exec_fd = 0
            # The interpreter reads the sealed copy, never the path that was checked.
            argv = [SCRIPT_PATH if a == decl.executable.path else a for a in argv]
        egress = None
        tcp_ports: list[int] = []
        extra = list(prepared.fds)
        if "egress-network" in fx:
            egress, tcp_ports = self._egress(prepared, decl, run_dir, mounts)
            extra.append(egress.control_fd)
            egress = Egress(listen_ports=egress.listen_ports, control_fd=len(extra) - 1)
        mounts = [*mounts, scratch, *inside]
        plan = Plan(
            executable=executable,
            argv=argv,
            env=child_env(decl.environment.inherit, decl.environment.set, SCRATCH),
            # A C3 action works in its write root; every other in its scratch.
            cwd=base,
            namespaces=NAMESPACES,
            user_namespace=not root,
            uid=uid,
            gid=gid,
            mounts=mounts,
            landlock=Landlock(read=read, full=full, tcp_connect_ports=tcp_ports),
            seccomp=True,
            rlimits=self._rlimits(decl),
            egress=egress,
            exec_fd=exec_fd,
            extra_fds=len(extra),
        )
        assert SCRIPT_FD == 3
        prepared.spec = self._spec(decl, argv, base, timeout_s, executable)
        prepared.argv = argv
        assert self.spawner is not None
        prepared.sandbox = Sandbox(self.spawner, plan, extra)

    def _egress(
        self, prepared: Prepared, decl: Declaration, run_dir: Path, mounts: list[Mount]
    ) -> tuple[Egress, list[int]]:
        """The relay session, and the names it answers bound over the action's /etc files."""
        from sensorium.connectors.os.effects import EgressSession
        from sensorium.connectors.os.egress import netsetup

        assert decl.egress_network is not None
        session = EgressSession(decl)
        prepared.egress = session
        ports = sorted({e.port for e in decl.egress_network.endpoints})
        run_dir.mkdir(mode=0o755, exist_ok=True)
        if run_dir not in prepared.host_dirs:
            prepared.host_dirs.append(run_dir)
        for name, body in (
            ("resolv.conf", netsetup.resolv_conf()),
            ("hosts", netsetup.hosts_file(session.addresses.mapping())),
        ):
            (run_dir / name).write_bytes(body)
            (run_dir / name).chmod(0o444)
            mounts.append(Mount(kind="bind", source=str(run_dir / name), target=f"/etc/{name}"))
        return Egress(listen_ports=ports, control_fd=session.theirs.fileno()), ports

    def _rlimits(self, decl: Declaration) -> dict[str, int]:
        limits = {
            "nproc": self.cfg.sandbox.max_processes,
            "nofile": self.cfg.sandbox.max_open_files,
            "core": 0,
        }
        if decl.fs_write is not None and "scoped-fs-write" in effects(decl):
            # One byte over the cap is allowed to happen, so that an overflow is seen
            # (the file is over the cap, or SIGXFSZ killed the writer) and never
            # committed as a silently truncated file.
            limits["fsize"] = decl.fs_write.max_bytes_per_file + 1
        return limits
