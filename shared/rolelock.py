"""One node per state directory: each process holds its role's lock while it runs.

``flock`` on ``run/<role>.lock``: the kernel drops it when the process dies, however
it dies, so a stale lock cannot exist and nothing needs cleaning up. A second
``sensorium-core`` (or connector, or poller) on the same state directory finds it
held and stops before binding anything, naming the process that holds it.
"""

from __future__ import annotations

import fcntl
import os

from sensorium.shared.paths import StatePaths

# Held open for the life of the process (never inherited: O_CLOEXEC).
_held: dict[str, int] = {}


class RoleTaken(Exception):
    """Another live process holds this role on this state directory."""


def take(paths: StatePaths, role: str) -> None:
    """Lock ``role`` on ``paths`` for this process; RoleTaken when another holds it."""
    if role in _held:
        return
    path = paths.run / f"{role}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RoleTaken(
            f"another {role} process (pid {holder}) already serves {paths.root}; "
            "one node per state directory: stop that node first (`sensorium stop`, or "
            "`systemctl stop sensorium.target` under systemd), or pass another --state-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[role] = fd


def holder(paths: StatePaths, role: str) -> int | None:
    """The pid holding ``role`` on ``paths`` now, or None when nobody does."""
    try:
        fd = os.open(paths.run / f"{role}.lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
