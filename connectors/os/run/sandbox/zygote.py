"""The spawn zygote: a single-threaded process that forks sandboxed actions on request.

The connector is threaded (ZeroMQ's I/O threads), and code between ``fork`` and
``exec`` in a threaded process may deadlock on a lock some other thread held.
So the connector starts this small process once; it has Python, ctypes and the
compiled seccomp filter warm, and forks a fresh sandbox stage in well under a
millisecond. Starting a new interpreter per action would cost ~20–40 ms.

Protocol over a SOCK_SEQPACKET pair: the connector sends one JSON plan with its
fds (stdout, stderr, report, then extras); the zygote replies ``<pid> <request>``
(and `` pooled`` when a parked init took it, see pool.py) with a pidfd of the
action's init, or ``0 <request> <reason>`` without one (``error <what>`` when no
init could be started). EOF ends the zygote.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import sys
from collections.abc import Callable

from sensorium.connectors.os.run.sandbox import execstage, stage
from sensorium.connectors.os.run.sandbox.plan import (
    DECODER,
    FD_REPORT,
    MAX_FDS,
    MAX_PLAN_BYTES,
    Plan,
)
from sensorium.connectors.os.run.sandbox.pool import Pool


def _reap() -> None:
    """Collect exited inits; reaped only here, after their pidfd was taken."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _filters() -> dict[str, bytes]:
    """One BPF program per socket policy a plan may name, compiled once; {} without
    seccomp."""
    try:
        from sensorium.connectors.os.run.sandbox import seccomp

        if not seccomp.available():
            return {}
        return {
            s: seccomp.compile_program(seccomp.build_filter(allow_unix_sockets=False, sockets=s))
            for s in ("inet", "none")
        }
    except Exception:
        return {}


def serve(sock: socket.socket) -> None:
    filters = _filters()
    exec_stage = execstage.open_stage()
    # Everything alive now is shared with every sandbox forked from here: out of the
    # collector's sight, a collection in a child never writes to (copies) those pages.
    gc.freeze()
    pool = Pool(filters, exec_stage)
    sock.settimeout(1.0)
    while True:
        _reap()
        pool.expire()
        try:
            # Close-on-exec: no exec'd process (a target, the exec stage) inherits a
            # plan's fds by accident; each is placed where it belongs explicitly.
            msg, fds, _flags, _addr = socket.recv_fds(
                sock, MAX_PLAN_BYTES, MAX_FDS, socket.MSG_CMSG_CLOEXEC
            )
        except TimeoutError:
            continue
        if not msg:
            return
        # Every plan is answered exactly once, in order (the connector relies on it),
        # by its number wherever it could be read.
        try:
            plan = DECODER.decode(msg)
        except Exception as exc:
            for fd in fds:
                os.close(fd)
            sock.send(f"0 ? bad plan: {exc}".encode())
            continue
        if len(fds) != 3 + plan.extra_fds:
            for fd in fds:
                os.close(fd)
            got = f"expected {3 + plan.extra_fds} fds, got {len(fds)}"
            sock.send(f"0 {plan.request} bad plan: {got}".encode())
            continue
        try:
            pooled = pool.take(plan, msg, fds)
        except Exception as exc:  # a bug here must fail this plan, not every queued one
            for fd in fds:
                os.close(fd)
            sock.send(f"0 {plan.request} error parked sandbox: {exc!r}".encode())
            continue
        if pooled is not None:
            pid, pidfd = pooled
            for fd in fds:
                os.close(fd)
        else:
            try:
                pid = _cold(plan, fds, filters, exec_stage)
            except OSError as exc:  # namespaces refused, or out of processes: say so, go on
                sock.send(f"0 {plan.request} error namespaces: {exc.strerror or exc}".encode())
                continue
            except Exception as exc:
                sock.send(f"0 {plan.request} error sandbox: {exc!r}".encode())
                continue
            finally:
                for fd in fds:
                    os.close(fd)
            # The init is our unreaped child, so its pid cannot be reused yet.
            try:
                pidfd = os.pidfd_open(pid)
            except OSError as exc:
                os.kill(pid, signal.SIGKILL)
                sock.send(f"0 {plan.request} pidfd_open: {exc.strerror}".encode())
                continue
        try:
            reply = f"{pid} {plan.request}{' pooled' if pooled else ''}"
            socket.send_fds(sock, [reply.encode()], [pidfd])
        finally:
            os.close(pidfd)
        # Off this spawn's path: its init has its plan and runs on its own. (Should it
        # fail, nothing is parked: the next plan of the shape goes cold.)
        with contextlib.suppress(Exception):
            pool.refill(plan)


def _cold(
    plan: Plan, fds: list[int], filters: dict[str, bytes], exec_stage: execstage.Stage | None
) -> int:
    """Start an init for ``plan`` from nothing; its pid. Its target is the exec stage
    where the stage can express the plan, else a fork of the init (which also says why
    a plan cannot run)."""
    seccomp_filter = filters.get(plan.sockets)
    records = (
        execstage.encode(plan, seccomp_filter, exec_stage.landlock_abi)
        if exec_stage is not None
        else None
    )
    start: Callable[[int, int], int] | None = None
    keep = fds
    if exec_stage is not None and records is not None:
        staged = exec_stage
        keep = [*fds, staged.fd]

        def start(err_w: int, go_r: int) -> int:
            return execstage.start(staged, err_w, go_r, records, fds)

    return stage.launch(
        plan,
        lambda: stage.run_init(plan, fds, seccomp_filter, start),
        keep=keep,
        report=fds[FD_REPORT],
    )


def main() -> None:
    stage.die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=int(sys.argv[1]))
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError, ConnectionResetError):
        serve(sock)


if __name__ == "__main__":
    main()
