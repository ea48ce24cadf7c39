"""Who holds a lease, and whether that holder still lives.

A poller's lease owner names its instance *and* its process: ``poller:<instance>@
<pid>:<start time>``. A poller killed mid-poll cannot release its leases, but the
process it names is gone (or its pid now belongs to a process started later), so
any other poller — the restarted one, at once — releases them instead of waiting
out ``lease_s``. An owner without that form (an operator's tool, an older poller)
is never judged dead: its leases lapse at ``lease_until`` as before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import apsw
import psutil

_PROCESS = re.compile(r"@(?P<pid>[0-9]+):(?P<start>[0-9A-Za-z.]+)$")


def owner_of(kind: str, instance: str) -> str:
    """The lease owner of this process's ``kind`` instance (``poller``)."""
    pid = os.getpid()
    return f"{kind}:{instance}@{pid}:{_started(pid)}"


def _started(pid: int) -> str:
    """When ``pid`` started, as a token that never changes while it runs: the kernel's
    start time in clock ticks since boot on Linux (immune to wall-clock steps), else
    psutil's creation time. Raises ``psutil.NoSuchProcess`` for a pid nobody holds."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise psutil.NoSuchProcess(pid) from None
    except OSError:
        pass
    else:
        # The fields after the command (which may hold spaces and parentheses).
        fields = stat[stat.rindex(b")") + 2 :].split()
        return fields[19].decode()  # field 22, starttime
    return f"{psutil.Process(pid).create_time():.2f}"


def alive(owner: str) -> bool:
    """False only when ``owner`` names a process that provably no longer runs."""
    m = _PROCESS.search(owner)
    if m is None:
        return True
    try:
        return _started(int(m["pid"])) == m["start"]
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError, ValueError, IndexError):  # not ours to judge: it lives
        return True


def release_dead(
    conn: apsw.Connection,
    transaction: Callable[[], Any],
    me: str,
    is_alive: Callable[[str], bool] = alive,
) -> list[str]:
    """Release every operation lease held by an owner that is dead; the owners released.
    Liveness is checked outside the transaction; the release is conditional on the
    same owner, so a lease taken meanwhile by someone else is left alone."""
    rows: list[Any] = conn.execute(
        "SELECT DISTINCT lease_owner FROM operations WHERE lease_until IS NOT NULL "
        "AND lease_owner IS NOT ?",
        (me,),
    ).fetchall()
    dead = [str(owner) for (owner,) in rows if owner is not None and not is_alive(str(owner))]
    if dead:
        with transaction() as tx:
            tx.executemany(
                "UPDATE operations SET lease_owner = NULL, lease_until = NULL "
                "WHERE lease_owner = ?",
                [(owner,) for owner in dead],
            )
    return dead
