"""An action's program joins the cgroup the connector made for it (run/cgroup.py), on
the real kernel through the real zygote, cold and from a parked sandbox alike.

This host may give cgroup v2 no memory controller (a v1 hybrid), so the probe rightly
finds nothing to use; the join itself needs only a cgroup v2 directory: its cpu.stat
counts what ran in it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sensorium.connectors.os.run import cgroup
from sensorium.connectors.os.run.launcher import spawn
from sensorium.connectors.os.run.sandbox import namespaces as ns
from sensorium.connectors.os.run.sandbox import seccomp
from sensorium.connectors.os.run.sandbox.plan import Mount, Plan
from sensorium.connectors.os.run.sandbox.spawner import Spawner
from sensorium.connectors.os.run.sandboxed import Sandbox
from sensorium.connectors.os.run.spawning import SpawnSpec

NAMESPACES = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWNET | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS
MOUNT = cgroup.cgroup2_mount(Path("/proc/self/mountinfo").read_text())
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not seccomp.available() or MOUNT is None,
    reason="namespaces, seccomp and a writable cgroup v2 hierarchy need root here",
)
# A known count of work, in the program and in a child it waits for.
SCRIPT = "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sh -c 'exit 0'; echo done"


@pytest.fixture
def parent() -> Iterator[cgroup.Delegated]:
    assert MOUNT is not None
    own = cgroup.own_cgroup(Path("/proc/self/cgroup").read_text()) or "/"
    base = MOUNT / own.strip("/") / f"sensorium-test-{os.getpid()}"
    base.mkdir()
    try:
        yield cgroup.Delegated(base)
    finally:
        for child in base.iterdir():
            if child.is_dir():
                child.rmdir()
        base.rmdir()


def _plan(cgroup_fd: int | None) -> Plan:
    return Plan(
        executable="/bin/sh",
        argv=["sh", "-c", SCRIPT],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/tmp",
        namespaces=NAMESPACES,
        uid=65534,
        gid=65534,
        mounts=[Mount(kind="tmpfs", target="/tmp", size_bytes=1 << 20, uid=65534, gid=65534)],
        cgroup_fd=cgroup_fd,
        extra_fds=0 if cgroup_fd is None else 1,
    )


def _usage_usec(path: Path) -> int:
    stat = dict(line.split() for line in (path / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"])


def test_the_program_joins_its_cgroup_cold_and_parked(parent: cgroup.Delegated) -> None:
    async def go() -> list[Path]:
        spawner = Spawner()
        spawner.start()
        used = []
        try:
            # The first plan of its shape starts cold, the next finds a parked init.
            for n in range(3):
                group = parent.create(f"t{n}")
                assert group is not None
                spec = SpawnSpec("/bin/sh", ["sh"], {}, "/tmp", 30, 4096, 4096)
                run = await spawn(spec, sandbox=Sandbox(spawner, _plan(0), [group.procs_fd]))
                group.close()
                assert run.exit_code == 0, (run.spawn_error, run.stderr.data)
                assert bytes(run.stdout.data) == b"done\n"
                assert run.usage is not None and run.usage.source == "rusage"
                used.append(group.path)
        finally:
            spawner.close()
        return used

    paths = asyncio.run(go())
    idle = parent.create("idle")  # the control: nothing ran in it, nothing counted
    assert idle is not None and _usage_usec(idle.path) == 0
    assert idle.usage() is None
    idle.remove()
    for path in paths:
        assert _usage_usec(path) > 0, path  # its program ran in it
        assert (path / "cgroup.procs").read_text() == ""  # and nothing is left
        cgroup.ActionGroup(path, -1).remove()
        assert not path.exists()
