"""The action's process tree, seen from its init: signal it, walk it, end it.

With a PID namespace the init is pid 1 and ``kill(-1)`` reaches exactly the action's
processes. Without one (a host that refuses it) the init is the subreaper of the
action's tree and finds it by parentage, also processes that called ``setsid()``.
"""

from __future__ import annotations

import contextlib
import os
import signal

# A bound on one walk of the action's tree; RLIMIT_NPROC keeps it far below this.
MAX_DESCENDANTS = 65536


def forward_sigterm(pid_ns: bool) -> None:
    """The connector's SIGTERM reaches every process of the action."""
    signal.signal(signal.SIGTERM, lambda *_: signal_all(signal.SIGTERM, pid_ns))


def signal_all(signum: int, pid_ns: bool) -> None:
    if pid_ns:  # pid 1: -1 is every other process of the namespace, and nothing else
        with contextlib.suppress(OSError):
            os.kill(-1, signum)
        return
    for pid in descendants():
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


# Bytes the init read from /proc walking the tree: its own reads, not the action's I/O.
_proc_reads = 0


def descendants() -> list[int]:
    """Every live descendant of this process, by parentage (/proc/<pid>/task/*/children)."""
    global _proc_reads
    found: list[int] = []
    todo = [os.getpid()]
    while todo and len(found) < MAX_DESCENDANTS:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    text = f.read()
                _proc_reads += len(text)
                kids = [int(k) for k in text.split()]
            except (OSError, ValueError):
                continue
            found += kids
            todo += kids
    return found


def kill_descendants() -> None:
    """SIGKILL the action's whole tree: children first die, their orphans come to us
    (the subreaper) and die in the next round; done when no child is left."""
    while True:
        for pid in descendants():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def proc_reads() -> int:
    """Bytes this process read from /proc walking the tree (not the action's I/O)."""
    return _proc_reads
