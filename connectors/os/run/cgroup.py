"""Per-action cgroup v2 accounting, where the connector was delegated a subtree.

Where a cgroup v2 hierarchy gives the connector's actions a parent it may write and
the memory controller, each action's program joins a cgroup of its own just before
exec, and its outcome's cpu time and peak memory are that cgroup's (``cpu.stat``
``user_usec``/``system_usec``, ``memory.peak``): the whole tree, every process it
started, summed. Elsewhere (cgroup v1 or hybrid without v2 controllers, no
delegation, a kernel without ``memory.peak``) :func:`probe` finds nothing and rusage
is used (``accounting.py``).

Chosen by probing, at start: the parent must be the connector's own cgroup when that
is its hierarchy's root (the root may hold processes and still give controllers to
its children), or else the cgroup above the connector's, which a delegated subtree
(systemd's ``Delegate=yes`` with each process in a leaf of its own) gives the
controllers. The probe makes a trial cgroup and checks the files are there; nothing
outside ``<parent>/sensorium-actions`` is ever written.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

from sensorium.connectors.os.run.accounting import Usage

BASE_NAME = "sensorium-actions"
_FILES = ("cgroup.procs", "cpu.stat", "memory.peak")


def cgroup2_mount(mountinfo: str) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/proc/self/mountinfo``)."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if sep and right.split()[:1] == ["cgroup2"]:
            fields = left.split()
            if len(fields) >= 5:
                return Path(fields[4])
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup v2 path (the ``0::`` line of ``/proc/self/cgroup``)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _parents(mount: Path, own: str) -> list[Path]:
    """Where the actions' cgroups may go, best first (see the module docstring)."""
    rel = own.strip("/")
    if not rel:
        return [mount]
    return [(mount / rel).parent]


@dataclass
class Delegated:
    """``<parent>/sensorium-actions``, with the memory controller for its children."""

    base: Path
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def create(self, tag: str) -> ActionGroup | None:
        """A fresh cgroup for one action; None (rusage then) if it cannot be made."""
        path = self.base / f"a-{os.getpid()}-{next(self._ids)}-{tag}"
        try:
            path.mkdir(mode=0o755)
            fd = os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return ActionGroup(path, fd)


def probe(
    mountinfo: Path = Path("/proc/self/mountinfo"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
) -> Delegated | None:
    try:
        mount = cgroup2_mount(mountinfo.read_text())
        own = own_cgroup(proc_cgroup.read_text())
    except OSError:
        return None
    if mount is None or own is None:
        return None
    for parent in _parents(mount, own):
        found = _try(parent)
        if found is not None:
            return found
    return None


def _try(parent: Path) -> Delegated | None:
    if "memory" not in _words(parent / "cgroup.subtree_control"):
        return None
    if not os.access(parent / "cgroup.procs", os.W_OK):
        return None  # a process cannot be moved below it
    base = parent / BASE_NAME
    try:
        base.mkdir(mode=0o755, exist_ok=True)
        if "memory" not in _words(base / "cgroup.subtree_control"):
            (base / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        return None
    delegated = Delegated(base)
    trial = delegated.create("probe")
    if trial is None:
        return None
    try:
        if not all((trial.path / f).exists() for f in _FILES):
            return None
    finally:
        trial.close()
        trial.remove()
    return delegated


@dataclass
class ActionGroup:
    """One action's cgroup: ``procs_fd`` is handed to the sandbox (the program writes
    ``0`` to it before exec), read once the action is gone, then removed."""

    path: Path
    procs_fd: int

    def close(self) -> None:
        if self.procs_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.procs_fd)
            self.procs_fd = -1

    def usage(self) -> Usage | None:
        """What the tree used; None when the program never joined (nothing ran in it:
        a program that ran at all used some cpu) or the files cannot be read."""
        try:
            stat = dict(
                line.split(" ", 1) for line in (self.path / "cpu.stat").read_text().splitlines()
            )
            usage_us, user_us, system_us = (
                int(stat["usage_usec"]),
                int(stat["user_usec"]),
                int(stat["system_usec"]),
            )
            peak = int((self.path / "memory.peak").read_text())
        except (OSError, KeyError, ValueError):
            return None
        if usage_us == 0:
            return None
        return Usage(
            source="cgroup-v2",
            cpu_user_ms=user_us / 1000,
            cpu_system_ms=system_us / 1000,
            peak_memory_bytes=peak,
        )

    def remove(self) -> None:
        """Once empty; a cgroup whose last process is still being released may refuse
        for a moment (EBUSY): the connector's start sweeps what is left."""
        self.close()
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return
            os.sched_yield()


def sweep(delegated: Delegated) -> None:
    """Remove action cgroups a connector that died left behind (empty ones only)."""
    with contextlib.suppress(OSError):
        for entry in delegated.base.iterdir():
            if entry.is_dir() and entry.name.startswith("a-"):
                with contextlib.suppress(OSError):
                    entry.rmdir()
