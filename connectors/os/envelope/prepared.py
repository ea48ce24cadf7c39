"""One invocation's set-up: the spawn spec, the sandbox plan's fds, and what comes back.

Torn down whatever happens: ``cleanup`` closes every fd (the layers' mounts go
with the last of them) and removes the host directories the run used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sensorium.connectors.os.run.accounting import Usage
from sensorium.connectors.os.run.cgroup import ActionGroup
from sensorium.connectors.os.run.sandbox.channel import SetupChannel
from sensorium.connectors.os.run.sandboxed import Sandbox
from sensorium.connectors.os.run.spawning import SpawnResult, SpawnSpec

if TYPE_CHECKING:
    from sensorium.connectors.os.effects.settle import EgressSession

# The directory fd of C3's layer is opened with this (no links on the way).
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Prepared:
    """Everything one invocation set up, to be torn down whatever happens."""

    spec: SpawnSpec
    argv: list[str]
    sandbox: Sandbox | None
    host_dirs: list[Path] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    channel: SetupChannel | None = None
    # What the init's setup message carries first, in plan order ("layer", "artifacts").
    exports: list[str] = field(default_factory=list)
    # After the run: the upper layer's and the artifact tmpfs's directory fds.
    upper: int | None = None
    artifacts: int | None = None
    xattr_prefix: str = "trusted.overlay."
    egress: EgressSession | None = None
    # The action's own cgroup, where a delegated cgroup v2 gives one (run/cgroup.py).
    cgroup: ActionGroup | None = None

    def begin(self) -> None:
        """From the event loop, right before the spawn."""
        if self.channel is not None:
            self.channel.begin()
        if self.egress is not None and self.channel is not None:
            self.egress.begin(self.channel, len(self.exports))

    def spawned(self) -> None:
        """The zygote holds its copy of the control socket: ours can go."""
        if self.channel is not None:
            self.channel.close_theirs()

    def collect(self) -> None:
        """After the run: take the exported layers the sandbox handed back, if it did."""
        if self.channel is None:
            return
        fds = self.channel.collect()
        named = dict(zip(self.exports, fds, strict=False))
        if "layer" in named:
            with contextlib.suppress(OSError):
                self.upper = os.open("upper", _DIR, dir_fd=named["layer"])
                self.fds.append(self.upper)
        self.artifacts = named.get("artifacts")

    def account(self, run: SpawnResult) -> None:
        """After the run: cpu and peak memory from the action's cgroup, if it had one."""
        if self.cgroup is None:
            return
        found = self.cgroup.usage()
        if found is not None:
            run.usage = (run.usage or Usage(source="rusage")).with_cgroup(found)

    def cleanup(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        if self.channel is not None:
            self.channel.close()
        for d in reversed(self.host_dirs):
            shutil.rmtree(d, ignore_errors=True)
        self.host_dirs.clear()
