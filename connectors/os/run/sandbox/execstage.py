"""The compiled exec stage of parked sandboxes: the zygote's half (``exec_stage.c``).

A parked target (``pool.py``) used to wait as a fork of the init's Python, decode its
plan, apply it (``stage.run_target``) and exec. Measured on a C1 spawn, that was
most of the time from hand-over to the action's first instruction: every object the
interpreter touches after a fork is a copy-on-write fault, and the exec then tears
the whole inherited heap down. So a parked target now execs the small C program
``sensorium-exec-stage`` while it waits; the zygote turns the plan into flat records
(:func:`encode`) and the stage applies them in ``run_target``'s order and execs.

The binary is built with the package (``setup.py``) where a C compiler exists. Without
it, or with ``SENSORIUM_EXEC_STAGE=off`` in the connector's environment, parked
targets keep the Python path; a plan the stage cannot express (no seccomp filter, no
Landlock on this kernel, an unknown rlimit) takes the cold path, which reports why.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import socket
import struct
from pathlib import Path
from typing import NoReturn

from sensorium.connectors.os.run.sandbox import landlock
from sensorium.connectors.os.run.sandbox.plan import FD_STDERR, FD_STDOUT, MAX_PLAN_BYTES, Plan
from sensorium.connectors.os.run.sandbox.stage import MAX_FD, RLIMITS

BINARY = Path(__file__).with_name("sensorium-exec-stage")
ENV_SWITCH = "SENSORIUM_EXEC_STAGE"

# Record tags and fd roles: exec_stage.c's enums, in the same order.
(T_EXE, T_ARG, T_ENV, T_CWD, T_RLIMIT, T_IDS, T_FD) = range(1, 8)
(T_LL_RULESET, T_LL_PATH, T_LL_PORT, T_SECCOMP, T_PROBE) = range(8, 13)
# exec_stage.c's STAGE_VERSION: a stage built from other records is never used.
STAGE_VERSION = 6
R_STDOUT, R_STDERR, R_EXEC, R_HAND, R_BINARY, R_CGROUP, R_GATE = range(7)
# Where the stage finds its three fds; what one plan may hold (exec_stage.c's MAX_*).
FD_PLAN, FD_ERROR, FD_GO = 3, 4, 5
# Where the reaper (reaper.c) finds the target's error pipe and the zygote's socket.
FD_REAP_ERROR, FD_REAP_CTL = 3, 4
MAX_ITEMS = 65536
_LOW = 10
PROBE_TIMEOUT_S = 5.0


class Stage:
    """The stage binary, opened once by the zygote, and the kernel facts it encodes for."""

    def __init__(self, fd: int, path: Path, landlock_abi: int) -> None:
        self.fd = fd
        self.path = path
        self.landlock_abi = landlock_abi

    def __repr__(self) -> str:
        return f"<Stage {self.path} fd={self.fd} landlock_abi={self.landlock_abi}>"


def open_stage() -> Stage | None:
    """The stage for this zygote, or None (not built, switched off, not executable)."""
    where = os.environ.get(ENV_SWITCH, "")
    if where == "off":
        return None
    path = Path(where) if where else BINARY
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    stage = Stage(fd, path.absolute(), landlock.abi_version())
    if not _runs(stage):
        os.close(fd)
        return None
    return stage


def _runs(stage: Stage) -> bool:
    """Whether this is our stage and it runs here (not one built for another machine
    or from other records, not on a noexec mount): asked for its version, it must
    answer exactly ours on its error pipe and end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    said_r, said_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            pid = spawn(stage, theirs.fileno(), said_w, go_r)
        finally:
            theirs.close()
            os.close(said_w)
            os.close(go_r)
        with contextlib.suppress(OSError):
            os.write(go_w, b"g")
            ours.send(_rec(T_PROBE, b""))
        ours.close()
        said = b""
        # Bounded: whatever it is, a program that never answers must not hold the zygote.
        while select.select([said_r], [], [], PROBE_TIMEOUT_S)[0] and len(said) < 64:
            if not (chunk := os.read(said_r, 64)):
                break
            said += chunk
        else:
            os.kill(pid, signal.SIGKILL)
        _pid, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0 and said == f"probe {STAGE_VERSION}".encode()
    except OSError:
        return False
    finally:
        ours.close()
        os.close(said_r)
        os.close(go_w)


def _rec(tag: int, data: bytes) -> bytes:
    return struct.pack("=II", tag, len(data)) + data


def _fd(role: int, index: int | None) -> bytes:
    return b"" if index is None else _rec(T_FD, struct.pack("=ii", role, index))


def encode(plan: Plan, seccomp_filter: bytes | None, landlock_abi: int) -> bytes | None:
    """``plan`` as the stage's records (its fds travel beside them, in plan order), or
    None when only the Python path can apply it (and say why it cannot)."""
    if plan.seccomp and not seccomp_filter:
        return None
    if plan.landlock is not None and landlock_abi <= 0:
        return None
    if any(name not in RLIMITS for name in plan.rlimits):
        return None
    # What os.execve refuses (and the Python path reports), never passed on quietly.
    if not plan.argv or not plan.argv[0] or any("=" in k or not k for k in plan.env):
        return None
    if any(
        "\0" in t for t in (plan.executable, plan.cwd, *plan.argv, *plan.env, *plan.env.values())
    ):
        return None
    try:
        out = [
            _rec(T_EXE, os.fsencode(plan.executable)),
            _rec(T_CWD, os.fsencode(plan.cwd)),
            *(_rec(T_ARG, os.fsencode(a)) for a in plan.argv),
            *(_rec(T_ENV, os.fsencode(f"{k}={v}")) for k, v in plan.env.items()),
            _rec(T_IDS, struct.pack("=II", plan.uid, plan.gid)),
            _fd(R_STDOUT, FD_STDOUT),
            _fd(R_STDERR, FD_STDERR),
            *(_rec(T_RLIMIT, struct.pack("=iQ", RLIMITS[n], v)) for n, v in plan.rlimits.items()),
        ]
    except (UnicodeError, struct.error):
        return None
    for role, extra in (
        (R_EXEC, plan.exec_fd),
        (R_HAND, plan.hand_fd),
        (R_BINARY, plan.binary_fd),
        (R_CGROUP, plan.cgroup_fd),
        (R_GATE, plan.gate_fd),
    ):
        out.append(_fd(role, None if extra is None else 3 + extra))
    if plan.landlock is not None:
        ll = _landlock(plan, landlock_abi)
        if ll is None:
            return None
        out.extend(ll)
    if plan.seccomp and seccomp_filter:
        out.append(_rec(T_SECCOMP, seccomp_filter))
    records = b"".join(out)
    # The stage's limits (MAX_MSG, MAX_ITEMS): past them only Python can run it.
    if len(records) > MAX_PLAN_BYTES or max(len(plan.argv), len(plan.env)) > MAX_ITEMS:
        return None
    return records


def _landlock(plan: Plan, abi: int) -> list[bytes] | None:
    """``landlock.restrict_self``'s ruleset and rules for ``abi``, as records."""
    assert plan.landlock is not None
    fs, net, scopes = (
        landlock.handled_fs(abi),
        landlock.handled_net(abi),
        landlock.handled_scopes(abi),
    )
    size = landlock.ruleset_size(abi)
    out = [_rec(T_LL_RULESET, struct.pack("=QQQI", fs, net, scopes, size))]
    for paths, access in (
        (plan.landlock.read, landlock.READ_RIGHTS & fs),
        (plan.landlock.full, fs),
    ):
        out.extend(_rec(T_LL_PATH, struct.pack("=Q", access) + os.fsencode(p)) for p in paths)
    if net:
        for port in plan.landlock.tcp_connect_ports:
            if not 0 <= port <= 65535:
                return None
            out.append(_rec(T_LL_PORT, struct.pack("=Q", port)))
    return out


def spawn(stage: Stage, plan_fd: int, err_w: int, go_r: int) -> int:
    """Start the stage as a child with ``plan_fd`` at fd 3, ``err_w`` at 4 and ``go_r``
    at 5; its pid. Started before the sandbox's mounts (see :func:`way`). OSError (and
    no child) when it cannot exec here."""
    found = way(stage)
    if found is None:
        raise OSError(errno.EACCES, f"no way to exec {stage.path} here")
    return spawn_with(found, [plan_fd, err_w, go_r])


def spawn_with(path: str, fds: list[int], args: list[str] | None = None) -> int:
    """posix_spawn the stage at ``path`` with ``fds`` at 3, 4, …, and ``args`` after its
    name; its pid. posix_spawn is vfork and exec: none of this interpreter's memory is
    copied (the ~1 ms of CPU a fork of it costs, and its teardown at exec)."""
    # Out of the way first (any may sit at 3, 4 or 5 already); dup2 clears CLOEXEC.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _LOW) for fd in fds]
    actions = [(os.POSIX_SPAWN_DUP2, fd, FD_PLAN + i) for i, fd in enumerate(high)]
    try:
        # One try: a failed one has used a pid, and the action's must be 2.
        return os.posix_spawn(path, [BINARY.name, *(args or [])], {}, file_actions=actions)
    finally:
        for fd in high:
            os.close(fd)


def way(stage: Stage) -> str | None:
    """A path that execs the stage here: its own, if this mount namespace shows the
    same file there on an exec mount, else its fd through /proc unless /proc is noexec
    (a fresh procfs is, and the kernel applies that to its fd links); None: neither."""
    with contextlib.suppress(OSError):
        own, there = os.fstat(stage.fd), os.stat(stage.path)
        if (there.st_dev, there.st_ino) == (own.st_dev, own.st_ino) and not _noexec(stage.path):
            return str(stage.path)
    return None if _noexec("/proc") else f"/proc/self/fd/{stage.fd}"


def _noexec(path: str | Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_NOEXEC)
    except OSError:
        return True


def start(stage: Stage, err_w: int, go_r: int, records: bytes, fds: list[int]) -> int:
    """The cold path's target: the stage, started and handed ``records`` with the
    plan's ``fds`` (it acts on them once ``go_r`` says so); its pid. Raises OSError
    (nothing left running) when it cannot."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours:
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_PLAN_BYTES)
            pid = spawn(stage, theirs.fileno(), err_w, go_r)
        finally:
            theirs.close()
        try:
            socket.send_fds(ours, [records], fds)
        except OSError:
            # It would read EOF and end quietly: never let that pass for a start.
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
    return pid


def reap(stage: Stage, target: int, err_r: int, ctl: int) -> tuple[int, int]:
    """A parked init, its namespace and target ready: exec the stage as ``reap
    <target>`` (reaper.c), which waits for the directive's report pipe on ``ctl`` and
    supervises ``target`` as ``stage.supervise`` would, as pid 1 without a Python heap
    to tear down at the end. Returns only when the exec failed: the ``(err_r, ctl)``
    to go on with in Python (moved; the originals are closed)."""
    binary = fcntl.fcntl(stage.fd, fcntl.F_DUPFD_CLOEXEC, _LOW)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _LOW) for fd in (err_r, ctl)]
    for fd in (err_r, ctl):
        os.close(fd)
    try:
        os.dup2(high[0], FD_REAP_ERROR)
        os.dup2(high[1], FD_REAP_CTL)
        # By its fd (execveat): the sandbox's mounts may hide the binary's path.
        os.execve(binary, [BINARY.name, "reap", str(target)], {})
    except OSError:
        pass
    for fd in (FD_REAP_ERROR, FD_REAP_CTL, binary):
        with contextlib.suppress(OSError):
            os.close(fd)
    return high[0], high[1]


def become(stage_fd: int, plan_fd: int, err_w: int, go_r: int) -> NoReturn:
    """In a forked target: exec the stage as :func:`spawn` would start it (where it
    could not be spawned). Never returns; says on ``err_w`` why when it cannot, so the
    init never reads a plain EOF there (which means "started")."""
    err = err_w
    try:
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, _LOW) for fd in (plan_fd, err_w, go_r)]
        binary = fcntl.fcntl(stage_fd, fcntl.F_DUPFD_CLOEXEC, _LOW)
        os.dup2(high[0], FD_PLAN)
        os.dup2(high[1], FD_ERROR)
        err = FD_ERROR
        os.dup2(high[2], FD_GO)
        os.closerange(FD_GO + 1, binary)
        os.closerange(binary + 1, MAX_FD)
        os.execve(binary, [BINARY.name], {})
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(err, f"setup: the exec stage could not start: {exc}".encode())
    finally:
        os._exit(127)
