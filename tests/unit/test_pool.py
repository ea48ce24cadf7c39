"""Parked sandboxes (run/sandbox/pool.py) on the real kernel, through the real zygote.

A parked init runs one plan and dies with it: the next plan of the shape gets a
fresh one (nothing left in /tmp, another init), a plan of another shape never gets
it, and plans whose namespace holds per-run mounts are never parked at all.
"""

from __future__ import annotations

import asyncio
import os

import msgspec
import pytest

from sensorium.connectors.os.run.launcher import spawn
from sensorium.connectors.os.run.sandbox import namespaces as ns
from sensorium.connectors.os.run.sandbox import seccomp
from sensorium.connectors.os.run.sandbox.plan import Mount, Plan
from sensorium.connectors.os.run.sandbox.pool import shape_of
from sensorium.connectors.os.run.sandbox.spawner import Sandboxed, Spawner
from sensorium.connectors.os.run.sandboxed import Sandbox
from sensorium.connectors.os.run.spawning import SpawnSpec

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not seccomp.available(), reason="namespaces and seccomp need root here"
)
NAMESPACES = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWNET | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS
# Lists what an earlier run could have left in /tmp, leaves something, names its pid.
SCRIPT = "ls -A /tmp; : > /tmp/left-behind; echo pid=$$"


def _plan(scratch_bytes: int = 1 << 20) -> Plan:
    return Plan(
        executable="/bin/sh",
        argv=["sh", "-c", SCRIPT],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/tmp",
        namespaces=NAMESPACES,
        uid=65534,
        gid=65534,
        mounts=[Mount(kind="tmpfs", target="/tmp", size_bytes=scratch_bytes, uid=65534, gid=65534)],
    )


def _spec() -> SpawnSpec:
    return SpawnSpec("/bin/sh", ["sh"], {}, "/tmp", timeout_s=30, stdout_cap=4096, stderr_cap=4096)


def _run(plans: list[Plan]) -> list[tuple[str, bool, int | None]]:
    """Each plan in turn through one zygote: (stdout, pooled, init pid)."""

    async def go() -> list[tuple[str, bool, int | None]]:
        spawner = Spawner()
        spawner.start()
        seen: list[tuple[str, bool, int | None]] = []
        original = spawner.spawn

        async def spy(*args: object, **kw: object) -> Sandboxed:
            sb = await original(*args, **kw)  # type: ignore[arg-type]
            seen.append(("", sb.pooled, sb.pid))
            return sb

        spawner.spawn = spy  # type: ignore[method-assign]
        try:
            out = []
            for plan in plans:
                result = await spawn(_spec(), sandbox=Sandbox(spawner, plan))
                assert result.exit_code == 0, (result.spawn_error, result.stderr.data)
                # The zygote parks the next init right after it answers, before it
                # reads another plan: the next plan of the shape always finds it.
                out.append(bytes(result.stdout.data).decode())
            return [(o, s[1], s[2]) for o, s in zip(out, seen, strict=True)]
        finally:
            spawner.close()

    return asyncio.run(go())


def test_a_parked_sandbox_runs_one_plan_and_the_next_gets_a_fresh_one() -> None:
    runs = _run([_plan(), _plan(), _plan()])
    assert [pooled for _, pooled, _ in runs] == [False, True, True]
    for out, _, _ in runs:
        # Nothing of an earlier run: its /tmp is empty, it is pid 2 of its own namespace.
        assert out == "pid=2\n", out
    pids = [pid for _, _, pid in runs]
    assert len(set(pids)) == 3, pids


def test_a_parked_sandbox_is_never_handed_a_plan_of_another_shape() -> None:
    runs = _run([_plan(1 << 20), _plan(2 << 20), _plan(2 << 20)])
    assert [pooled for _, pooled, _ in runs] == [False, False, True]
    assert all(out == "pid=2\n" for out, _, _ in runs), runs


def test_plans_with_per_run_mounts_or_no_pid_namespace_are_never_parked() -> None:
    plan = _plan()
    assert shape_of(plan) is not None
    exported = [*plan.mounts, Mount(kind="tmpfs", target="/tmp/a", export=True)]
    assert shape_of(msgspec.structs.replace(plan, mounts=exported)) is None
    overlay = [*plan.mounts, Mount(kind="overlay", target="/srv", options="lowerdir=/srv")]
    assert shape_of(msgspec.structs.replace(plan, mounts=overlay)) is None
    assert shape_of(msgspec.structs.replace(plan, control_fd=0, extra_fds=1)) is None
    assert shape_of(msgspec.structs.replace(plan, namespaces=0, mounts=[])) is None
    # Ids are part of the shape: the id maps were written for them.
    assert shape_of(msgspec.structs.replace(plan, uid=1000)) != shape_of(plan)
