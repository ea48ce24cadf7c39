"""The zygote's half of ``park.c``: parked sandboxes started without a fork of Python.

``pool.Pool.refill`` used to clone the zygote itself into a new namespace and let that
copy of the interpreter make the mounts, start the target and exec the reaper. Its
page tables were copied at the clone, every object the child touched was a
copy-on-write fault, and the exec tore the copy down: about 2 ms of CPU per directive,
the largest cost left on a spawn. Now the zygote starts the exec stage once as
``park`` (posix_spawn: nothing of the zygote is copied) and hands it each shape; it
clones the init with ``CLONE_PARENT``, so the init is still the zygote's child (pidfd,
reaping and PDEATHSIG unchanged), and everything the init does is C.
"""

from __future__ import annotations

import contextlib
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
# The parker clones, writes three small files and answers: far below this anywhere.
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


class Refused(OSError):
    """The parker answered that it started no sandbox (and let no init go): the
    Python park may try the same sockets."""


class Parker:
    """The zygote's ``park`` process, started at its first use and again after it died."""

    def __init__(self, stage: execstage.Stage) -> None:
        self._stage = stage
        self._sock: socket.socket | None = None
        self._pid = -1
        # Signalled through this, never by pid: the zygote's reaping loop may have
        # collected the parker, and its pid be another process's by now.
        self._pidfd = -1

    def __repr__(self) -> str:
        return f"<Parker pid={self._pid}>"

    def start(self, records: bytes, ctl: int, tctl: int) -> int:
        """Park one sandbox of the shape ``records``: the init's pid (the zygote's child).
        ``ctl`` and ``tctl`` are the init's and the target's sockets, as for pool.park.
        :class:`Refused` when the parker says it started none (nothing is left
        running then but an init that exits by itself, never having read a socket);
        any other OSError when its answer was lost, and an init it let go may hold
        ``ctl`` and ``tctl``: they must not be handed to another."""
        if not records:  # an empty datagram reads as EOF there
            raise Refused("error park: a bad shape")
        try:
            sock = self._sock or self._spawn()
            socket.send_fds(sock, [records], [ctl, tctl])
        except OSError as exc:  # no parker, or it never got these sockets
            self.close()
            raise Refused(f"error park: {exc}") from exc
        try:
            said = sock.recv(256).decode(errors="replace")
        except OSError:
            self.close()  # dead or stuck: the next shape gets a fresh one
            raise
        if not said:
            self.close()
            raise OSError("park: the parker ended without an answer")
        if not said.isdigit():
            raise Refused(said)
        return int(said)

    def _spawn(self) -> socket.socket:
        way = execstage.way(self._stage)
        if way is None:
            raise OSError(f"no way to exec {self._stage.path} here")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._pid = execstage.spawn_with(way, [theirs.fileno()], ["park"])
            self._pidfd = os.pidfd_open(self._pid)  # our unreaped child: still that pid
        except OSError:
            ours.close()
            self.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(ANSWER_TIMEOUT_S)
        self._sock = ours
        return ours

    def close(self) -> None:
        """End the parker (EOF, then SIGKILL if it is stuck) and reap it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            # Reaped here unless the zygote's loop did already (then waitid says so).
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED)
            os.close(self._pidfd)
            self._pidfd = -1
        self._pid = -1
