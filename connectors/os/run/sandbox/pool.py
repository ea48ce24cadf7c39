"""Parked sandboxes: single-use inits already inside fresh namespaces, in the zygote.

The costly part of a spawn before the action's own code — clone(2) into new user,
PID, mount, network, IPC and UTS namespaces, the id maps, the mounts, a fresh
procfs — depends only on the plan's *shape* (its namespaces, ids and mounts), not on
the directive. So after each spawn of a shape the zygote starts one more init of that
shape and parks it: it sets its namespace up, forks the target, and both wait on
sockets of their own. The next plan of that shape is handed straight to the target
with its fds (SCM_RIGHTS), and the report pipe to the init, which goes on as any init;
the target applies the plan's rlimits, ids, Landlock and seccomp and execs. Where the
exec stage is built, a parked sandbox is C from its start: the zygote's parker
(park.c, through park.py) clones it, and the zygote is never copied; else the zygote
clones itself (:func:`park`). A parked sandbox runs exactly one plan and dies with
it, like any other, so no two actions ever share a namespace; it never ran anything
before. When no init of the shape is parked (the
first spawn, several at once, a shape with per-run mounts) the spawn takes the cold
path and nothing changes.

Only plans whose namespace carries nothing of one run are parked: a PID namespace,
no egress, no control socket, no exported or overlay mounts (C1 and C2; C3–C6 build
per-run layers). A parked init older than ``MAX_AGE_S`` is discarded, so the host's
mount table it copied is never old.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass
from typing import NoReturn

import msgspec

from sensorium.connectors.os.run.sandbox import execstage, stage, tree
from sensorium.connectors.os.run.sandbox import namespaces as ns
from sensorium.connectors.os.run.sandbox import park as cpark
from sensorium.connectors.os.run.sandbox.plan import (
    DECODER,
    ENCODER,
    FD_REPORT,
    MAX_FDS,
    MAX_PLAN_BYTES,
    Mount,
    Plan,
)

MAX_SHAPES = 4
MAX_AGE_S = 30.0


class Shape(msgspec.Struct, frozen=True):
    """What a parked init builds before it knows its plan."""

    namespaces: int
    user_namespace: bool
    proc: bool
    uid: int
    gid: int
    mounts: list[Mount]


def shape_of(plan: Plan) -> bytes | None:
    """The key of ``plan``'s shape, or None when its namespace holds something of its run."""
    if not plan.namespaces & ns.CLONE_NEWPID or plan.egress is not None:
        return None
    if plan.control_fd is not None or any(m.export or m.kind == "overlay" for m in plan.mounts):
        return None
    return ENCODER.encode(
        Shape(plan.namespaces, plan.user_namespace, plan.proc, plan.uid, plan.gid, plan.mounts)
    )


def park(
    plan: Plan,
    shape: bytes,
    ctl: int,
    tctl: int,
    filters: dict[str, bytes],
    exec_stage: execstage.Stage | None = None,
) -> NoReturn:
    """A parked init (in its namespaces already): set them up for ``plan``'s shape and
    fork its target; the zygote will hand the one plan the sandbox runs, with its fds,
    straight to the target (on ``tctl``), and the report pipe to the init (on ``ctl``),
    which then supervises the target. With ``exec_stage`` the target waits as the
    compiled exec stage (execstage.py), not as Python. Never returns."""
    stage.die_with_parent()
    tree.forward_sigterm(pid_ns=True)
    try:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        target = -1
        if exec_stage is not None:
            # Before the mounts, which may hide its path; it waits for go_r.
            with contextlib.suppress(OSError):
                target = execstage.spawn(exec_stage, tctl, err_w, go_r)
        stage.setup_namespace(plan, [])
        if target < 0:
            target = os.fork()  # a Python target, or one that execs the stage by its fd
    except BaseException:
        os._exit(1)
    if target == 0:
        try:
            os.close(ctl)
            os.close(err_r)
            os.close(go_w)
            if exec_stage is not None:
                execstage.become(exec_stage.fd, tctl, err_w, go_r)
            os.close(go_r)
            mine, fds = _receive(tctl, shape)
        except BaseException:
            os._exit(1)
        stage.run_target(mine, fds, err_w, filters.get(mine.sockets))
    os.close(go_r)
    if exec_stage is not None:  # the namespace is ready: the stage may take its plan
        try:
            os.write(go_w, b"g")
        except OSError:
            os._exit(1)
    os.close(go_w)
    os.close(err_w)
    os.close(tctl)
    if exec_stage is not None:
        # pid 1 becomes the C reaper until the action ends; back here only if it cannot.
        err_r, ctl = execstage.reap(exec_stage, target, err_r, ctl)
    try:
        sock = socket.socket(fileno=ctl)
        msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 1)
        sock.close()
        if msg != b"report" or len(fds) != 1:
            os._exit(0)  # discarded, or the zygote is gone: the target goes with us
    except BaseException:
        os._exit(1)
    stage.supervise(fds[0], target, err_r, pid_ns=True, staged=exec_stage is not None)


def _receive(fd: int, shape: bytes) -> tuple[Plan, list[int]]:
    """The one plan (and its fds) a parked process gets; exits at EOF (discarded, or
    the zygote is gone). The zygote checked the shape and the fds: checked again."""
    sock = socket.socket(fileno=fd)
    msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_PLAN_BYTES, MAX_FDS)
    sock.close()
    if not msg:
        os._exit(0)
    mine = DECODER.decode(msg)
    if shape_of(mine) != shape or len(fds) != 3 + mine.extra_fds:
        os._exit(1)
    return mine, list(fds)


@dataclass
class Parked:
    pid: int
    pidfd: int
    ctl: socket.socket  # to the init: the report pipe
    tctl: socket.socket  # to the target: the plan and its fds
    born: float
    staged: bool  # the target waits as the exec stage: it takes records, not a plan

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        os.close(self.pidfd)
        self.ctl.close()
        self.tctl.close()


class Pool:
    """The zygote's parked inits: at most one per shape, for the last MAX_SHAPES shapes."""

    def __init__(self, filters: dict[str, bytes], stage: execstage.Stage | None = None) -> None:
        self._filters = filters
        self._stage = stage
        self._parked: dict[bytes, Parked] = {}
        self._parker = cpark.Parker(stage) if stage is not None else None

    def take(self, plan: Plan, msg: bytes, fds: list[int]) -> tuple[int, int] | None:
        """Hand ``plan`` and its fds to a parked init of its shape: (pid, pidfd), the
        pidfd now the caller's; None when there is none (or it died: it is dropped)."""
        key = shape_of(plan)
        parked = self._parked.pop(key, None) if key is not None else None
        if parked is None:
            return None
        if parked.staged:
            assert self._stage is not None
            records = execstage.encode(
                plan, self._filters.get(plan.sockets), self._stage.landlock_abi
            )
            if records is None:  # only the Python path can say why this plan cannot run
                parked.discard()
                return None
            msg = records
        # Both wake at once: the target to apply the plan, the init to watch it.
        try:
            socket.send_fds(parked.tctl, [msg], fds)
        except OSError:  # it died parked: the plan reached nobody
            parked.discard()
            return None
        # The plan is in: never the cold path now, so it can never run twice. An init
        # that cannot take the report pipe is dead, and its namespace with it: the
        # connector reads EOF before "started".
        with contextlib.suppress(OSError):
            socket.send_fds(parked.ctl, [b"report"], [fds[FD_REPORT]])
        parked.ctl.close()
        parked.tctl.close()
        return parked.pid, parked.pidfd

    def refill(self, plan: Plan) -> None:
        """Park one init of ``plan``'s shape unless one is parked already."""
        key = shape_of(plan)
        if key is None or key in self._parked:
            return
        while len(self._parked) >= MAX_SHAPES:
            self._parked.pop(next(iter(self._parked))).discard()
        # Nothing of this directive stays in the parked process's memory.
        bare = msgspec.structs.replace(plan, argv=[], env={}, executable="", cwd="/")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        tours, ttheirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        tours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_PLAN_BYTES)  # as the zygote's
        staged = self._stage
        try:
            ctl, tctl = theirs.fileno(), ttheirs.fileno()
            pid = self._start_in_c(bare, ctl, tctl)
            if pid is None:
                pid = stage.launch(
                    bare,
                    lambda: park(bare, key, ctl, tctl, self._filters, staged),
                    keep=[ctl, tctl] if staged is None else [ctl, tctl, staged.fd],
                )
            pidfd = os.pidfd_open(pid)
        except OSError:
            ours.close()
            tours.close()
            return
        finally:
            theirs.close()
            ttheirs.close()
        self._parked[key] = Parked(pid, pidfd, ours, tours, time.monotonic(), staged is not None)

    def _start_in_c(self, bare: Plan, ctl: int, tctl: int) -> int | None:
        """Park through park.c (no fork of this interpreter): the init's pid, or None
        where only the Python park can (no stage, a shape park.c cannot express, or
        the parker refused it: the Python park then says nothing new, but its init
        may still come up where the parker's could not). OSError when the parker's
        answer was lost: an init it let go may hold ``ctl`` and ``tctl``, so nothing
        is parked on them this time."""
        if self._parker is None:
            return None
        records = cpark.shape(bare, root_maps=os.getuid() == 0)
        if records is None:
            return None
        try:
            return self._parker.start(records, ctl, tctl)
        except cpark.Refused:
            return None

    def expire(self) -> None:
        """Discard parked inits older than MAX_AGE_S."""
        now = time.monotonic()
        for key, parked in list(self._parked.items()):
            if now - parked.born > MAX_AGE_S:
                del self._parked[key]
                parked.discard()
