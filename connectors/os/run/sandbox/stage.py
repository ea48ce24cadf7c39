"""The two processes between the zygote's clone and the action's exec.

* **init** (pid 1 of the action's PID namespace, cloned by the zygote straight
  into the action's namespaces; see :func:`launch`): makes the action's mounts
  and network, forks the target, forwards SIGTERM to every process of the
  namespace (also those that called ``setsid()``), reaps orphans, and reports
  the target's wait status. It exits when the target does — and with it every
  descendant. It dies with the zygote (PDEATHSIG), and a PID namespace dies with
  its init, so killing the init kills everything; the connector signals it
  through a pidfd, and that pidfd turns readable only once the kernel has
  killed every other process of the namespace.
* **target**: new session, fds 0–2 only, cwd, rlimits, unprivileged ids,
  Landlock, seccomp, exec. A failure before exec is written to a CLOEXEC pipe,
  so the connector tells "could not start" from "started and failed".

Both are forked from a single-threaded process, so Python is safe to run
between fork and exec here — unlike in the threaded connector.

The report pipe carries one line per event: ``staged`` (the compiled exec stage,
``execstage.py``, is the target), ``started``, ``usage <what the action used>``
(``run/accounting.py``), ``exit <wait status>``, ``error <what>``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import gc
import os
import resource
import signal
import socket
from collections.abc import Callable
from typing import NoReturn

# Imported here, in the zygote, never after the fork: the target drops to a uid
# that may not be able to read this interpreter's library directory.
from sensorium.connectors.os.effects.egress import netsetup
from sensorium.connectors.os.run import accounting
from sensorium.connectors.os.run.sandbox import landlock, seccomp, tree
from sensorium.connectors.os.run.sandbox import namespaces as ns
from sensorium.connectors.os.run.sandbox.plan import FD_REPORT, FD_STDERR, FD_STDOUT, Mount, Plan

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]
_libc.prctl.restype = ctypes.c_int

RLIMITS = {
    "nproc": resource.RLIMIT_NPROC,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
    "data": resource.RLIMIT_DATA,
}
# Where the error pipe lives in the target while it closes every other fd.
_ERR_FD_MIN = 64
# Above any fd this process can hold (one close_range(2) call, whatever the bound).
MAX_FD = max(1 << 16, os.sysconf("SC_OPEN_MAX"))


def _report(fd: int, line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, (line.replace("\n", " ") + "\n").encode())


def die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def launch(plan: Plan, body: Callable[[], object], keep: list[int], report: int = -1) -> int:
    """In the zygote: clone a process straight into ``plan``'s namespaces to run
    ``body`` (which must not return); its pid.

    One clone(2) makes it pid 1 of its namespaces, and the zygote, still outside,
    writes the user namespace's id maps (root and the ids the action drops to for a
    root connector; only its own ids otherwise) before it lets the child go on, as
    bubblewrap and nsjail do: no monitor or map-writing helper in between. The child
    keeps only fds 0–2 and ``keep``. Raises OSError when no process could be started;
    a map that cannot be written is said on ``report`` (when given) and the child,
    never let go, exits.
    """
    flags = plan.namespaces | (ns.CLONE_NEWUSER if plan.user_namespace else 0)
    go_r, go_w = os.pipe2(os.O_CLOEXEC) if plan.user_namespace else (-1, -1)
    try:
        pid = ns.clone(flags)
    except BaseException:
        if go_r >= 0:
            os.close(go_r)
            os.close(go_w)
        raise
    if pid == 0:
        try:
            # Short-lived, and a collection would only copy the zygote's pages.
            gc.disable()
            # Nothing of the zygote's: its socket, other sandboxes' parked channels.
            _close_all_but([*keep, go_r])
            if go_r >= 0:
                # Nothing privileged before our ids exist: EOF means they never will.
                if os.read(go_r, 1) != b"g":
                    os._exit(1)
                os.close(go_r)
            body()
        finally:
            os._exit(1)
    if go_r >= 0:
        os.close(go_r)
        try:
            if os.getuid() == 0:
                ns.write_id_maps_of(pid, plan.uid, plan.gid)
            else:
                ns.write_own_id_maps_of(pid, plan.uid, plan.gid)
        except OSError as exc:
            if report >= 0:
                _report(report, f"error namespaces: uid_map of the user namespace: {exc}")
        else:
            os.write(go_w, b"g")
        finally:
            os.close(go_w)
    return pid


def _close_all_but(keep: list[int]) -> None:
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, MAX_FD)


def _mount(m: Mount, sources: dict[str, int], exported: list[int]) -> None:
    if m.kind == "tmpfs":
        ns.tmpfs(
            m.target,
            size_bytes=m.size_bytes,
            mode=m.mode,
            uid=m.uid,
            gid=m.gid,
            read_only=m.read_only,
            inodes=m.inodes,
        )
        if m.export:
            exported.append(os.open(m.target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    elif m.kind == "bind":
        assert m.source is not None
        # Through the fd opened before any mount: the source may be hidden by now
        # (a state dir under the /tmp that the action's scratch covers).
        ns.bind(f"/proc/self/fd/{sources[m.source]}", m.target, read_only=m.read_only)
    elif m.kind == "mkdir":
        os.mkdir(m.target, m.mode)
        if m.uid is not None and m.gid is not None:
            os.chown(m.target, m.uid, m.gid)
    else:
        ns.mount("overlay", m.target, "overlay", ns.MS_NOSUID | ns.MS_NODEV, m.options)


def setup_namespace(plan: Plan, fds: list[int]) -> None:
    """The action's mounts and network, made by its init before the target is forked."""
    exported: list[int] = []
    if plan.namespaces & ns.CLONE_NEWNS:
        ns.make_private()
        sources = {
            m.source: os.open(m.source, os.O_PATH | os.O_CLOEXEC)
            for m in plan.mounts
            if m.kind == "bind" and m.source is not None
        }
        # The whole host tree read-only: Landlock leaves chmod, chown, utimes and
        # xattrs alone, a read-only mount does not. Only the plan's own mounts,
        # made on top, can be written.
        ns.set_read_only("/", read_only=True, recursive=True)
        if plan.namespaces & ns.CLONE_NEWPID and plan.proc:
            ns.mount_proc()
        for m in plan.mounts:
            _mount(m, sources, exported)
        for fd in sources.values():
            os.close(fd)
    listeners: list[socket.socket] = []
    if plan.egress is not None:
        netsetup.loopback_up()
        ipv6 = netsetup.route_all_local()
        opened = netsetup.open_listeners(plan.egress.listen_ports, plan.egress.udp_ports, ipv6=ipv6)
        listeners = [*opened, netsetup.open_dns()]
    if plan.control_fd is not None:
        control = socket.socket(fileno=fds[3 + plan.control_fd])
        try:
            socket.send_fds(control, [b"setup"], [*exported, *(s.fileno() for s in listeners)])
        finally:
            control.detach()
    for s in listeners:
        s.close()
    for fd in exported:
        os.close(fd)


def run_init(
    plan: Plan,
    fds: list[int],
    seccomp_filter: bytes | None,
    start: Callable[[int, int], int] | None = None,
) -> NoReturn:
    """Pid 1 of the action's namespace, or without a PID namespace the subreaper of
    the action's tree. ``start(err_w, go_r)`` starts the target as the exec stage
    before the mounts are made and hands it the plan (execstage.start), which it
    applies once ``go_r`` says the namespace is ready; without it, or when it fails,
    the target is a fork of this process. Never returns."""
    report = fds[FD_REPORT]
    pid_ns = bool(plan.namespaces & ns.CLONE_NEWPID)
    if not pid_ns:
        # Orphans of the action come to us instead of the host's init, so parentage
        # finds every descendant, also those that left the process group.
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    tree.forward_sigterm(pid_ns)
    die_with_parent()
    try:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        target = -1
        if start is not None:
            with contextlib.suppress(OSError):
                target = start(err_w, go_r)
        staged = target > 0
        os.close(go_r)
        setup_namespace(plan, fds)
        if target < 0:
            target = os.fork()
    except OSError as exc:
        _report(report, f"error sandbox: {exc.strerror or exc}")
        os._exit(1)
    except BaseException as exc:
        _report(report, f"error sandbox: {exc!r}")
        os._exit(1)
    if target == 0:
        os.close(err_r)
        os.close(go_w)
        run_target(plan, fds, err_w, seccomp_filter)
    if staged:  # the namespace is ready: the stage may apply the plan now
        with contextlib.suppress(OSError):  # it ended already: its error pipe says why
            os.write(go_w, b"g")
    os.close(go_w)
    os.close(err_w)
    for i, fd in enumerate(fds):
        if i != FD_REPORT:
            os.close(fd)
    supervise(fds[FD_REPORT], target, err_r, pid_ns, staged)


def supervise(report: int, target: int, err_r: int, pid_ns: bool, staged: bool = False) -> NoReturn:
    """The init once its target is forked (and has the plan): say on ``report``
    whether the program started (and, with ``staged``, that the exec stage started
    it), reap orphans, report the target's exit and leave with it. ``err_r`` reads the
    target's error pipe (EOF at exec)."""
    failure = _read_all(err_r)
    if staged:
        _report(report, "staged")
    if failure:
        _report(report, f"error {failure}")
        os._exit(1)
    _report(report, "started")
    io = accounting.IoTally()
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if pid == target:
            # Before the exit line: the connector reads both once the report closes.
            _report(report, accounting.of_children(io, tree.proc_reads()).line())
            _report(report, f"exit {status}")
            if not pid_ns:
                tree.kill_descendants()
            # Leaving takes every other process of the namespace with us.
            os._exit(0)


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def run_target(plan: Plan, fds: list[int], err_w: int, seccomp_filter: bytes | None) -> NoReturn:
    """The action itself, up to exec. Never returns."""
    step = "setup"
    err = err_w
    try:
        err = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, _ERR_FD_MIN)
        if plan.gate_fd is not None:
            # Nothing of the plan is applied before the connector's start row is on disk.
            step = "gate"
            if os.read(fds[3 + plan.gate_fd], 1) != b"g":
                why = "the connector withdrew this start before it began"
                raise OSError(errno.ECANCELED, f"{why}: {os.strerror(errno.ECANCELED)}")
            os.close(fds[3 + plan.gate_fd])
            step = "setup"
        if plan.cgroup_fd is not None:
            # Into the action's cgroup while still privileged: if refused, the
            # connector finds it empty and accounts by rusage instead.
            with contextlib.suppress(OSError):
                os.write(fds[3 + plan.cgroup_fd], b"0")
        # Ignored signals survive exec: Python ignores SIGPIPE and SIGXFSZ, the zygote
        # SIGINT, and whatever started the node may have ignored more (nohup: SIGHUP).
        # The program gets every default, as from the compiled stage (a pipe reader
        # going away kills it; RLIMIT_FSIZE kills it with SIGXFSZ).
        for signum in signal.valid_signals():
            if signum not in (signal.SIGKILL, signal.SIGSTOP):
                with contextlib.suppress(OSError, ValueError):  # libc's own (32, 33)
                    signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())  # and none blocked
        os.setsid()
        step = "stdio"
        # Above every number dup2 fills below, so none of them overwrites it.
        handed = (
            fcntl.fcntl(fds[3 + plan.hand_fd], fcntl.F_DUPFD_CLOEXEC, 5)
            if plan.hand_fd is not None
            else -1
        )
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[FD_STDOUT], 1)
        os.dup2(fds[FD_STDERR], 2)
        keep = 3
        if plan.exec_fd is not None:
            os.dup2(fds[3 + plan.exec_fd], 3)
            keep = 4
        if handed >= 0:
            os.dup2(handed, keep)
            keep += 1
        binary = -1
        if plan.binary_fd is not None:
            # Close-on-exec: the program never sees the fd it was started from.
            binary = fcntl.fcntl(fds[3 + plan.binary_fd], fcntl.F_DUPFD_CLOEXEC, err + 1)
        os.closerange(keep, err)
        os.closerange(err + 1, binary if binary >= 0 else MAX_FD)
        if binary >= 0:
            os.closerange(binary + 1, MAX_FD)
        step = f"cwd {plan.cwd}"
        os.chdir(plan.cwd)
        step = "rlimits"
        for name, value in plan.rlimits.items():
            resource.setrlimit(RLIMITS[name], (value, value))
        if os.getuid() != plan.uid or os.getgid() != plan.gid:
            step = f"drop to uid {plan.uid}"
            os.setgroups([])
            os.setresgid(plan.gid, plan.gid, plan.gid)
            os.setresuid(plan.uid, plan.uid, plan.uid)
        if plan.landlock is not None:
            step = "landlock"
            landlock.restrict_self(
                read=plan.landlock.read,
                full=plan.landlock.full,
                tcp_connect_ports=plan.landlock.tcp_connect_ports,
            )
        if plan.seccomp:
            step = "seccomp"
            if seccomp_filter is None:
                raise OSError(errno.ENOSYS, "no seccomp filter could be built (libseccomp?)")
            seccomp.install_program(seccomp_filter)
        step = f"exec {plan.executable}"
        os.execve(binary if binary >= 0 else plan.executable, plan.argv, plan.env)
    except OSError as exc:
        code = exc.errno or errno.EIO
        with contextlib.suppress(Exception):
            os.write(err, f"{step}: {exc.strerror or exc} [errno {code}]".encode())
    except BaseException as exc:  # anything at all: the pipe must say it, never a hang
        with contextlib.suppress(Exception):
            os.write(err, f"{step}: {exc!r}".encode())
    os._exit(127)
