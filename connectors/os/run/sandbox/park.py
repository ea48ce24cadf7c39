"""The zygote's half of ``park.c``: a parked sandbox started without a fork of Python.

``pool.Pool.refill`` used to clone the zygote itself into a new namespace and let that
copy of the interpreter make the mounts, start the target and exec the reaper. Its
page tables were copied at the clone, every object the child touched was a
copy-on-write fault, and the exec tore the copy down: about 2 ms of CPU per directive,
the largest cost left on a spawn. Now the zygote ``posix_spawn``s the exec stage as
``park`` (vfork and exec: nothing of the zygote is copied) and hands it the shape; the
helper clones the init with ``CLONE_PARENT``, so the init is still the zygote's child
(pidfd, reaping and PDEATHSIG unchanged), and everything the init does is C.
"""

from __future__ import annotations

import os
import signal
import socket
import struct

from sensorium.connectors.os.run.sandbox import execstage
from sensorium.connectors.os.run.sandbox.plan import Mount, Plan

P_SHAPE, P_MOUNT = 1, 2
_KINDS = {"tmpfs": 0, "bind": 1, "mkdir": 2}
# park.c's MAX_SHAPE and MAX_MOUNTS.
MAX_SHAPE = 64 * 1024
MAX_MOUNTS = 256
# The helper clones, writes three small files and answers: far below this anywhere.
ANSWER_TIMEOUT_S = 5.0


def _rec(tag: int, data: bytes) -> bytes:
    return struct.pack("=II", tag, len(data)) + data


def _mount(m: Mount) -> bytes | None:
    if m.kind not in _KINDS or m.export:
        return None
    target = os.fsencode(m.target) + b"\0"
    source = os.fsencode(m.source or "") + b"\0"
    if b"\0" in target[:-1] or b"\0" in source[:-1] or (m.kind == "bind") != bool(m.source):
        return None
    head = struct.pack(
        "=IIqqQqII",
        _KINDS[m.kind],
        m.mode,
        -1 if m.uid is None else m.uid,
        -1 if m.gid is None else m.gid,
        m.size_bytes,
        -1 if m.inodes is None else m.inodes,
        int(m.read_only),
        len(target),
    )
    return _rec(P_MOUNT, head + target + source)


def shape(plan: Plan, *, root_maps: bool) -> bytes | None:
    """``plan``'s shape as park.c's records, or None when park.c cannot build it (the
    Python park then does)."""
    if len(plan.mounts) > MAX_MOUNTS:
        return None
    try:
        mounts = [_mount(m) for m in plan.mounts]
        head = struct.pack(
            "=QIIIII",
            plan.namespaces,
            int(plan.user_namespace),
            int(plan.proc),
            plan.uid,
            plan.gid,
            int(root_maps),
        )
    except (struct.error, UnicodeError):
        return None
    if any(m is None for m in mounts):
        return None
    records = _rec(P_SHAPE, head) + b"".join(m for m in mounts if m is not None)
    return records if len(records) <= MAX_SHAPE else None


def start(stage: execstage.Stage, records: bytes, ctl: int, tctl: int) -> int:
    """Park one sandbox of the shape ``records``: the init's pid (the zygote's child).
    ``ctl`` and ``tctl`` are the init's and the target's sockets, as for pool.park.
    OSError when none could be started; nothing is left running then but an init
    that exits by itself (the zygote reaps it)."""
    way = execstage.way(stage)
    if way is None:
        raise OSError(f"no way to exec {stage.path} here")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours:
        try:
            ours.send(records)
            helper = execstage.spawn_with(way, [ctl, tctl, theirs.fileno()], ["park"])
        finally:
            theirs.close()
        try:
            ours.settimeout(ANSWER_TIMEOUT_S)
            said = ours.recv(256).decode(errors="replace")
        except OSError:
            os.kill(helper, signal.SIGKILL)  # never answering must not hold the zygote
            raise
        finally:
            os.waitpid(helper, 0)
    if not said.isdigit():
        raise OSError(said or "park: the helper ended without an answer")
    return int(said)
