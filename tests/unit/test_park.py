"""park.c: a parked sandbox started without a fork of the zygote, on the real kernel.

What it builds is checked against the Python park by test_exec_stage.py (the action
cannot tell them apart, as root and as an ordinary uid) and by test_pool.py; here,
what it does when it cannot build one: every failure ends before a target exists, is
said to the zygote or found dead by it, and the spawn takes the cold path.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import subprocess
from pathlib import Path

import pytest
from harness import NODE_UID, unprivileged_runtime

from sensorium.connectors.os.run.sandbox import execstage, park, seccomp
from sensorium.connectors.os.run.sandbox import namespaces as ns
from sensorium.connectors.os.run.sandbox.plan import Mount, Plan
from sensorium.connectors.os.run.sandbox.pool import Pool

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not seccomp.available(),
        reason="namespaces and a second uid need root here",
    ),
    pytest.mark.skipif(
        not execstage.BINARY.exists() and os.environ.get("CI") != "true",
        reason=f"{execstage.BINARY.name} was not built (no C compiler at install)",
    ),
]
NAMESPACES = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWNET | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS
# Bounds a wait for the kernel to end a process: generous, never reached when it works.
GONE_TIMEOUT_S = 30.0


def _plan(*mounts: Mount, uid: int = 65534) -> Plan:
    return Plan(
        executable="/bin/true",
        argv=["true"],
        env={},
        cwd="/",
        namespaces=NAMESPACES,
        uid=uid,
        gid=uid,
        mounts=list(mounts) or [Mount(kind="tmpfs", target="/tmp", size_bytes=1 << 20)],
    )


def _stage() -> execstage.Stage:
    stage = execstage.open_stage()
    assert stage is not None, "the exec stage does not run here"
    return stage


def _shape_with(target: bytes, source: bytes, namespaces: int = NAMESPACES) -> bytes:
    """park.c's records by hand: a shape, then one bind mount of exactly these bytes."""
    head = struct.pack("=QIIIII", namespaces, 0, 1, 65534, 65534, 1)
    mount = struct.pack("=IIqqQqII", 1, 0o700, -1, -1, 0, -1, 1, len(target))
    return park._rec(park.P_SHAPE, head) + park._rec(park.P_MOUNT, mount + target + source)


def _children() -> set[int]:
    """This process's live and unreaped children."""
    found: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            found |= {int(pid) for pid in f.read().split()}
    return found


def test_shapes_park_c_cannot_build_are_left_to_the_python_park() -> None:
    tmp = Mount(kind="tmpfs", target="/tmp", size_bytes=1 << 20)
    assert park.shape(_plan(tmp), root_maps=True) is not None
    for odd in (
        Mount(kind="tmpfs", target="/out", export=True),
        Mount(kind="overlay", target="/w", options="lowerdir=/a"),
        Mount(kind="bind", target="/x"),  # a bind with no source
        Mount(kind="mkdir", target="/x", source="/etc"),  # a source it would ignore
        Mount(kind="tmpfs", target="/a\0b"),
    ):
        assert park.shape(_plan(tmp, odd), root_maps=True) is None, odd
    many = [Mount(kind="mkdir", target=f"/tmp/{i}") for i in range(park.MAX_MOUNTS + 1)]
    assert park.shape(_plan(*many), root_maps=True) is None


@pytest.mark.parametrize(
    "records",
    [
        b"",
        b"\x01\x00\x00\x00\x05\x00\x00\x00short",  # a shape record of the wrong size
        b"\x09\x00\x00\x00\x00\x00\x00\x00",  # an unknown record
        b"\x01\x00\x00\x00\xff\x00\x00\x00",  # a length past the end
        # Found in review: a source that is not inside its record, or shorter than it.
        _shape_with(b"/mnt\0", b""),
        _shape_with(b"/mnt\0", b"/etc\0x\0"),
        # No PID namespace: the init's kill(-1) would reach the host's processes.
        _shape_with(b"/tmp\0", b"\0", namespaces=NAMESPACES & ~ns.CLONE_NEWPID),
    ],
)
def test_a_bad_shape_is_refused_before_any_clone_and_the_parker_goes_on(records: bytes) -> None:
    parker = park.Parker(_stage())
    before = _children()
    ctl, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    tctl, tpeer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        with pytest.raises(OSError, match="bad shape"):
            parker.start(records, peer.fileno(), tpeer.fileno())
        assert _children() - before <= {parker._pid}  # nothing cloned
        # The same parker still parks a good shape.
        good = park.shape(_plan(), root_maps=True)
        assert good is not None
        pid = parker.start(good, peer.fileno(), tpeer.fileno())
        assert pid in _children() and pid != parker._pid  # the zygote's child, not its
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    finally:
        parker.close()
        for s in (ctl, peer, tctl, tpeer):
            s.close()
    assert _children() == before  # the parker reaped too


def test_a_mount_that_fails_ends_the_parked_init_and_the_plan_goes_cold() -> None:
    """The init dies before its target exists; the zygote finds it dead when a plan
    comes, and the spawn takes the cold path (which says why)."""
    missing = Mount(kind="bind", target="/mnt", source="/nonexistent/sensorium-park-source")
    plan = _plan(missing)
    pool = Pool({}, _stage())
    pool.refill(plan)
    (parked,) = pool._parked.values()
    assert select.select([parked.pidfd], [], [], GONE_TIMEOUT_S)[0], "the init did not end"
    # It was the zygote's (this process's) child, as a Python-parked init is.
    _, status = os.waitpid(parked.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
    fds = [os.open("/dev/null", os.O_WRONLY) for _ in range(3)]
    try:
        assert pool.take(plan, b"", fds) is None
    finally:
        for fd in fds:
            os.close(fd)
    assert not pool._parked


def test_an_ordinary_uid_that_asks_for_root_maps_is_refused_by_the_kernel() -> None:
    """The parker writes the id maps as the zygote's own uid: root's maps are not
    its to write, and it says so; the init, never let go, ends without running."""
    python, path = unprivileged_runtime()
    code = (
        "import os, socket\n"
        "from sensorium.connectors.os.run.sandbox import execstage, park\n"
        "from sensorium.connectors.os.run.sandbox import namespaces as ns\n"
        "from sensorium.connectors.os.run.sandbox.plan import Mount, Plan\n"
        "uid = os.getuid()\n"
        "plan = Plan(executable='/bin/true', argv=['true'], env={}, cwd='/', uid=uid, gid=uid,\n"
        f"    namespaces={NAMESPACES}, user_namespace=True,\n"
        "    mounts=[Mount(kind='tmpfs', target='/tmp', size_bytes=1 << 20)])\n"
        "stage = execstage.open_stage()\n"
        "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "parker = park.Parker(stage)\n"
        "ok = parker.start(park.shape(plan, root_maps=False), b.fileno(), d.fileno())\n"
        "print('own', os.waitpid(ok, os.WNOHANG)[0] == 0)\n"
        "try:\n"
        "    parker.start(park.shape(plan, root_maps=True), b.fileno(), d.fileno())\n"
        "except OSError as exc:\n"
        "    print('root', exc)\n"
    )
    done = subprocess.run(
        [python, "-c", code],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(path)},
        user=NODE_UID,
        group=NODE_UID,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # Its own ids: an init that waits, parked (its parent is this uid's process).
    assert lines[0] == "own True", done.stdout
    assert lines[1].startswith("root error namespaces: uid_map of the user namespace"), lines


def test_a_lost_answer_parks_nothing_on_those_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review: when the parker's answer is lost (here: it is stopped), an init
    it let go may hold the shape's sockets; the Python park must not get the same ones.
    Nothing is parked this time, and the next refill starts a fresh parker."""
    monkeypatch.setattr(park, "ANSWER_TIMEOUT_S", 0.5)
    plan = _plan()
    pool = Pool({}, _stage())
    pool.refill(plan)
    (first,) = pool._parked.values()
    pool._parked.clear()
    first.discard()
    assert pool._parker is not None
    stuck = pool._parker._pid
    os.kill(stuck, signal.SIGSTOP)
    pool.refill(plan)
    assert not pool._parked  # neither the parker's nor the Python park's
    assert pool._parker._pid == -1  # the stuck parker was ended (and reaped)
    assert not os.path.exists(f"/proc/{stuck}")
    pool.refill(plan)
    (parked,) = pool._parked.values()  # a fresh parker parks again
    assert pool._parker._pid not in (-1, stuck)
    parked.discard()
    pool._parker.close()


def test_a_parker_that_cannot_start_leaves_the_shape_to_the_python_park(tmp_path: Path) -> None:
    """Nothing was started, so the same sockets are safe for the Python park: a stage
    binary that cannot be executed (here: mode 0644) still parks, the slower way."""
    copy = tmp_path / execstage.BINARY.name
    copy.write_bytes(execstage.BINARY.read_bytes())
    copy.chmod(0o644)
    real = _stage()
    fd = os.open(copy, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pool = Pool({}, execstage.Stage(fd, copy, real.landlock_abi))
        pool.refill(_plan())
        (parked,) = pool._parked.values()
        assert pool._parker is not None and pool._parker._pid == -1  # none running
        parked.discard()
        os.waitpid(parked.pid, 0)
    finally:
        os.close(fd)
