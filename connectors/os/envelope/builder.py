"""One action's envelope: turn a declaration into a sandbox plan, and its run into results.

A class is a set of effects (``read`` always; C3 adds ``scoped-fs-write``, C4
``egress-network``, C5 ``artifact-produce``; C6 names its own), and every effect
adds its mechanism to one plan, so C6 is the union of the others by
construction and an effect not named gets no mechanism at all — it is denied.

In the namespace tier the action sees a private, capped tmpfs at ``/tmp`` as its
scratch and working directory (gone with its namespace), its write root (C3, an
overlay whose upper layer is a capped tmpfs) and ``/tmp/artifacts`` (C5, a
capped tmpfs the connector promotes from after exit). Both capped layers are
mounted inside the action's namespaces and handed back as directory fds over the
plan's control socket, so no class needs the connector to be root. In the
landlock tier (no namespaces) the scratch is a directory of the state dir's
``scratch/`` and only Landlock and seccomp confine the action.

Whatever the tier, nothing of the node is reachable from an action: the state
directory, and the connector's home and runtime directory, are masked (namespace
tier) or carved out of every Landlock grant (landlock tier).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sensorium.connectors.os.effects.settle import EgressSession
from sensorium.connectors.os.envelope.classes import effects
from sensorium.connectors.os.envelope.handed import (
    FIRST_HANDED_FD,
    open_signer_channel,
    signer_env,
)
from sensorium.connectors.os.envelope.prepared import Prepared
from sensorium.connectors.os.envelope.private import needed_beneath, private_paths
from sensorium.connectors.os.envelope.probe import Runtime
from sensorium.connectors.os.envelope.render import render
from sensorium.connectors.os.run import cgroup
from sensorium.connectors.os.run.baseline import child_env
from sensorium.connectors.os.run.sandbox import darwin, fsprofile
from sensorium.connectors.os.run.sandbox import namespaces as ns
from sensorium.connectors.os.run.sandbox.channel import SetupChannel
from sensorium.connectors.os.run.sandbox.grants import carve
from sensorium.connectors.os.run.sandbox.pinned import open_pinned
from sensorium.connectors.os.run.sandbox.plan import Egress, Landlock, Mount, Plan
from sensorium.connectors.os.run.sandbox.script import SCRIPT_FD, SCRIPT_PATH, seal
from sensorium.connectors.os.run.sandbox.spawner import Spawner
from sensorium.connectors.os.run.sandboxed import Sandbox
from sensorium.connectors.os.run.spawning import SpawnSpec
from sensorium.shared.config import NodeConfig
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.fs_policy import FsPolicy

if TYPE_CHECKING:
    pass

SCRATCH = "/tmp"
ARTIFACT_DIR = "/tmp/artifacts"
PTS = "/dev/pts"
NAMESPACES = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWNET | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS
# Devices every program expects; nothing else under /dev is granted by the baseline.
DEVICES_READ = ("/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")
DEVICES_FULL = ("/dev/null",)
# Room for a tmpfs's own directories beside its capped contents.
TMPFS_SLACK = 256 * 1024


def _inodes(size_bytes: int) -> int:
    """A tmpfs's inode cap from its byte cap: empty files cost slab, not bytes."""
    return max(128, size_bytes // 1024)


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
        self.private = private_paths(paths)
        self.state_dir = os.path.realpath(paths.root)
        # This node's landlock-tier scratch dirs in /tmp, told apart from other nodes'.
        node = hashlib.sha256(self.state_dir.encode()).hexdigest()[:12]
        self.scratch_prefix = f"sensorium-scratch-{node}-"
        # Set by start(): where each action gets a cgroup of its own, if anywhere.
        self.cgroups: cgroup.Delegated | None = None

    def __repr__(self) -> str:
        return f"<EnvelopeBuilder tier={self.runtime.tier} spawner={self.spawner!r}>"

    def start(self) -> None:
        """Clear what a killed connector left behind, and make the masking source."""
        if self.work.is_dir():
            for entry in self.work.iterdir():
                if entry.is_dir():
                    # Host mounts of an older version of this connector, if any.
                    for mountpoint in ("mnt", "artifacts"):
                        with contextlib.suppress(OSError):
                            ns.umount(str(entry / mountpoint))
                    shutil.rmtree(entry, ignore_errors=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.sweep_scratch()
        # Read-only once made: replaced, never rewritten (an ordinary user may not
        # write a 0444 file of its own, so a second start must not try).
        self.empty_file.unlink(missing_ok=True)
        self.empty_file.write_bytes(b"")
        self.empty_file.chmod(0o444)
        self.cgroups = cgroup.probe()
        if self.cgroups is not None:
            cgroup.sweep(self.cgroups)

    def prepare(
        self,
        decl: Declaration,
        parameters: dict[str, object],
        run_id: str,
        timeout_s: float,
        *,
        canary: str | None = None,
        signer_token: str | None = None,
    ) -> Prepared:
        """Raises RenderError, ScriptError or OSError; the caller maps them to codes.

        ``canary`` names a no-op program run instead of the action's own, under
        exactly the action's envelope (its argv is not rendered, its script not read).
        """
        if sys.platform == "darwin" and signer_token is not None:
            raise OSError(errno.ENOTSUP, "no scoped signer grant on this platform yet")
        if sys.platform == "darwin":  # the macOS backend: sandbox-exec, no zygote
            run = self.work / run_id
            return darwin.prepare(decl, parameters, self.policy, run, self._spec, timeout_s)
        if self.spawner is None or not self.runtime.sandbox:
            raise OSError(errno.EPERM, f"no sandbox can be built here ({self.runtime.why_not()})")
        prepared = Prepared(spec=None, argv=[], sandbox=None)  # type: ignore[arg-type]
        try:
            self._prepare_sandboxed(
                prepared, decl, parameters, run_id, timeout_s, canary, signer_token
            )
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

    def hidden(self, decl: Declaration) -> list[str]:
        """What this action must not see of the node: the state dir always; the home and
        runtime dirs unless the action's own files live there."""
        return [p for p in self.private if p == self.state_dir or not needed_beneath(decl, p)]

    def _scratch(self, prepared: Prepared, run_id: str, uid: int, gid: int) -> str:
        """The landlock tier's scratch: a fresh 0700 directory of the action's uid in the
        host's temporary directory (the state dir is not reachable for a dropped uid)."""
        scratch = tempfile.mkdtemp(prefix=f"{self.scratch_prefix}{run_id}-", dir=SCRATCH)
        prepared.host_dirs.append(Path(scratch))
        if self.runtime.root:
            os.chown(scratch, uid, gid)
        return scratch

    def sweep_scratch(self) -> None:
        """Landlock-tier scratch dirs a killed connector of this node left behind."""
        owners = (os.getuid(), self.cfg.sandbox.uid)
        with contextlib.suppress(OSError):
            for entry in os.scandir(SCRATCH):
                if (
                    entry.name.startswith(self.scratch_prefix)
                    and entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_uid in owners
                ):
                    shutil.rmtree(entry.path, ignore_errors=True)

    def _prepare_sandboxed(
        self,
        prepared: Prepared,
        decl: Declaration,
        parameters: dict[str, object],
        run_id: str,
        timeout_s: float,
        canary: str | None,
        signer_token: str | None = None,
    ) -> None:
        sb = self.cfg.sandbox
        root = self.runtime.root
        uid, gid = (sb.uid, sb.gid) if root else (os.getuid(), os.getgid())
        namespaced = self.runtime.tier == "namespaces"
        fx = effects(decl)
        scratch_path = SCRATCH if namespaced else self._scratch(prepared, run_id, uid, gid)
        values = {"scratch": scratch_path}
        # Mounts whose targets lie outside the scratch first; the scratch tmpfs then
        # covers the host's /tmp, and what goes inside the scratch comes after it.
        # No terminal of the host's, not even to read (no class permits a TTY).
        mounts: list[Mount] = (
            [
                Mount(
                    kind="tmpfs", target=PTS, size_bytes=4096, inodes=16, mode=0o555, read_only=True
                )
            ]
            if namespaced and os.path.isdir(PTS)
            else []
        )
        inside: list[Mount] = []
        full = [scratch_path, *DEVICES_FULL]
        base = scratch_path
        run_dir = self.work / run_id
        if "scoped-fs-write" in fx:
            assert decl.fs_write is not None
            base = values["write_root"] = self._layer(prepared, decl, run_dir, mounts, uid, gid)
            full.append(base)
        if "artifact-produce" in fx:
            assert decl.artifact is not None
            size = decl.artifact.max_bytes_total + TMPFS_SLACK
            inside.append(Mount(kind="mkdir", target=ARTIFACT_DIR, mode=0o700, uid=uid, gid=gid))
            inside.append(
                Mount(
                    kind="tmpfs",
                    target=ARTIFACT_DIR,
                    size_bytes=size,
                    inodes=_inodes(size),
                    mode=0o700,
                    uid=uid,
                    gid=gid,
                    export=True,
                )
            )
            prepared.exports.append("artifacts")
            values["artifact_dir"] = ARTIFACT_DIR
        profile = fsprofile.effective_profile(self.policy, decl.fs_profile)
        reads = fsprofile.compile_read(profile, base=base)
        hidden = self.hidden(decl)
        if namespaced:
            grants = list(reads.grants)
            for masked in [*reads.masks, *hidden]:
                if os.path.isdir(masked):
                    mounts.append(
                        Mount(
                            kind="tmpfs",
                            target=masked,
                            size_bytes=4096,
                            inodes=16,
                            mode=0,
                            read_only=True,
                        )
                    )
                elif os.path.lexists(masked):
                    mounts.append(Mount(kind="bind", source=str(self.empty_file), target=masked))
        else:
            # No mount namespace to mask with: the grants themselves leave these out.
            grants = carve(reads.grants, [*reads.masks, *hidden, PTS, "/dev/ptmx"])
        executable = canary or decl.executable.interpreter or decl.executable.path
        read = [*grants, executable, *DEVICES_READ]
        argv = ["true"] if canary else render(decl.executable.argv_shape, parameters, values)
        exec_fd = binary_fd = None
        exe = decl.executable
        if exe.kind == "script" and not canary:
            # Every class runs a script the C2 way: opened beneath its root, no links,
            # pinned bytes checked, sealed in a memfd the interpreter reads.
            roots = decl.script.allowed_roots if decl.script is not None else []
            sealed = seal(exe.path, roots, exe.sha256)
            prepared.fds.append(sealed.fd)
            exec_fd = len(prepared.fds) - 1
            # The interpreter reads the sealed copy, never the path that was checked.
            argv = [SCRIPT_PATH if a == exe.path else a for a in argv]
        elif exe.sha256 is not None and not canary:
            prepared.fds.append(open_pinned(exe.path, exe.sha256))
            binary_fd = len(prepared.fds) - 1
        env = child_env(decl.environment.inherit, decl.environment.set, scratch_path)
        hand_fd = None
        if signer_token is not None and not canary:
            prepared.fds.append(open_signer_channel(self.paths, signer_token))
            hand_fd = len(prepared.fds) - 1
            env.update(signer_env(FIRST_HANDED_FD + (exec_fd is not None), signer_token))
        egress = None
        tcp_ports: list[int] = []
        extra = list(prepared.fds)
        if "egress-network" in fx:
            egress, tcp_ports = self._egress(prepared, decl, run_dir, mounts)
        control_fd = None
        if prepared.exports or egress is not None:
            prepared.channel = SetupChannel()
            extra.append(prepared.channel.theirs.fileno())
            control_fd = len(extra) - 1
        cgroup_fd = None
        if self.cgroups is not None:
            prepared.cgroup = self.cgroups.create(run_id)
            if prepared.cgroup is not None:
                extra.append(prepared.cgroup.procs_fd)
                cgroup_fd = len(extra) - 1
        if namespaced:
            scratch = Mount(
                kind="tmpfs",
                target=SCRATCH,
                size_bytes=sb.scratch_max_bytes,
                inodes=_inodes(sb.scratch_max_bytes),
                mode=0o700,
                uid=uid,
                gid=gid,
            )
            mounts = [*mounts, scratch, *inside]
        plan = Plan(
            executable=executable,
            argv=argv,
            env=env,
            # A C3 action works in its write root; every other in its scratch.
            cwd=base,
            namespaces=NAMESPACES if namespaced else 0,
            user_namespace=namespaced and (not root or self.runtime.userns_for_root),
            proc=self.runtime.fresh_proc,
            uid=uid,
            gid=gid,
            mounts=mounts if namespaced else [],
            landlock=Landlock(read=read, full=full, tcp_connect_ports=tcp_ports),
            seccomp=True,
            sockets="inet" if namespaced else "none",
            rlimits=self._rlimits(decl),
            egress=egress,
            control_fd=control_fd,
            exec_fd=exec_fd,
            binary_fd=binary_fd,
            hand_fd=hand_fd,
            cgroup_fd=cgroup_fd,
            extra_fds=len(extra),
        )
        assert SCRIPT_FD == 3
        prepared.spec = self._spec(decl, argv, base, timeout_s, executable)
        prepared.argv = argv
        assert self.spawner is not None
        prepared.sandbox = Sandbox(self.spawner, plan, extra, after_send=prepared.spawned)

    def _layer(
        self,
        prepared: Prepared,
        decl: Declaration,
        run_dir: Path,
        mounts: list[Mount],
        uid: int,
        gid: int,
    ) -> str:
        """C3: an overlay over write_root whose upper layer is a capped tmpfs made in the
        action's namespace and handed back, so the commit reads it after the action."""
        assert decl.fs_write is not None
        w = decl.fs_write
        run_dir.mkdir(mode=0o700, exist_ok=True)
        if run_dir not in prepared.host_dirs:
            prepared.host_dirs.append(run_dir)
        layer = run_dir / "mnt"
        layer.mkdir(mode=0o700)
        size = w.max_bytes_total + TMPFS_SLACK
        # The upper layer's own directories and the work dir, beside the files.
        inodes = w.max_files + 16
        userns = not self.runtime.root or self.runtime.userns_for_root
        prepared.xattr_prefix = "user.overlay." if userns else "trusted.overlay."
        prepared.exports.append("layer")
        mounts += [
            Mount(
                kind="tmpfs",
                target=str(layer),
                size_bytes=size,
                inodes=inodes,
                mode=0o755,
                export=True,
            ),
            Mount(kind="mkdir", target=f"{layer}/upper", mode=0o755, uid=uid, gid=gid),
            Mount(kind="mkdir", target=f"{layer}/work", mode=0o700),
            Mount(
                kind="overlay",
                target=w.write_root,
                # No redirects, no metadata-only copy-up: every change the action
                # makes is whole in the upper layer, where the commit reads it. In a
                # user namespace only user.* xattrs can be written (userxattr).
                # (nofollow: with userxattr the kernel refuses a mode that follows).
                options=(
                    f"lowerdir={w.write_root},upperdir={layer}/upper,workdir={layer}/work,"
                    + (
                        "redirect_dir=nofollow,metacopy=off,userxattr"
                        if userns
                        else "redirect_dir=off,metacopy=off"
                    )
                ),
            ),
        ]
        return w.write_root

    def _egress(
        self, prepared: Prepared, decl: Declaration, run_dir: Path, mounts: list[Mount]
    ) -> tuple[Egress, list[int]]:
        """The relay session, and the names it answers bound over the action's /etc files."""
        from sensorium.connectors.os.effects.egress import netsetup

        assert decl.egress_network is not None
        session = EgressSession(decl, self.cfg.egress)
        prepared.egress = session
        ends = decl.egress_network.endpoints
        ports = sorted({e.port for e in ends if e.protocol != "udp"})
        udp_ports = sorted({e.port for e in ends if e.protocol == "udp"})
        run_dir.mkdir(mode=0o755, exist_ok=True)
        if run_dir not in prepared.host_dirs:
            prepared.host_dirs.append(run_dir)
        for name, body in (
            ("resolv.conf", netsetup.resolv_conf()),
            ("hosts", netsetup.hosts_file(session.addresses.mapping())),
        ):
            if name == "hosts" and not os.path.exists("/etc/hosts"):
                # Nothing to bind over (a minimal container): the DNS stub, which
                # resolv.conf names, answers the declared names on its own.
                continue
            (run_dir / name).write_bytes(body)
            (run_dir / name).chmod(0o444)
            mounts.append(Mount(kind="bind", source=str(run_dir / name), target=f"/etc/{name}"))
        return Egress(listen_ports=ports, udp_ports=udp_ports), ports

    def _rlimits(self, decl: Declaration) -> dict[str, int]:
        limits = {
            "nproc": self.cfg.sandbox.max_processes,
            "nofile": self.cfg.sandbox.max_open_files,
            "core": 0,
            "data": min(
                self.cfg.sandbox.max_memory_bytes,
                decl.limits.memory_max_bytes or self.cfg.sandbox.max_memory_bytes,
            ),
        }
        if decl.fs_write is not None and "scoped-fs-write" in effects(decl):
            # One byte over the cap is allowed to happen, so that an overflow is seen
            # (the file is over the cap, or SIGXFSZ killed the writer) and never
            # committed as a silently truncated file.
            limits["fsize"] = decl.fs_write.max_bytes_per_file + 1
        return limits
