"""The spawn gate (launcher.spawn's ``gate``): a sandbox is built while the connector's
start journal writes its row, and its action runs only once that succeeded.

Through a real zygote and real sandboxes. What the action sees when the gate closes
unopened is compared between the compiled stage and the Python path, as root and as
an ordinary uid, in test_exec_stage.py ("gate-closed").
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
import pytest

from sensorium.connectors.os.run.launcher import spawn
from sensorium.connectors.os.run.sandbox import namespaces as ns
from sensorium.connectors.os.run.sandbox import seccomp
from sensorium.connectors.os.run.sandbox.plan import Mount, Plan
from sensorium.connectors.os.run.sandbox.spawner import Spawner
from sensorium.connectors.os.run.sandboxed import Sandbox
from sensorium.connectors.os.run.spawning import NotStarted, SpawnSpec
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not seccomp.available(), reason="namespaces and seccomp need root here"
)
NAMESPACES = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWNET | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS


def _plan(seen: Path) -> Plan:
    """Leaves a file in ``seen`` (a host directory) if the action ever runs."""
    return Plan(
        executable="/bin/sh",
        argv=["sh", "-c", "echo ran >> /mnt/ran; echo ran"],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/tmp",
        namespaces=NAMESPACES,
        uid=65534,
        gid=65534,
        mounts=[
            Mount(kind="tmpfs", target="/tmp", size_bytes=1 << 20, uid=65534, gid=65534),
            Mount(kind="bind", target="/mnt", source=str(seen), read_only=False),
        ],
    )


def _spec() -> SpawnSpec:
    return SpawnSpec("/bin/sh", ["sh"], {}, "/tmp", timeout_s=30, stdout_cap=4096, stderr_cap=4096)


def test_the_action_runs_once_its_gate_succeeds_and_never_when_it_fails(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()
    seen.chmod(0o777)
    tmp_path.chmod(0o755)

    async def go() -> None:
        spawner = Spawner()
        spawner.start()
        try:
            opened: list[str] = []

            async def good() -> None:
                await asyncio.sleep(0)
                opened.append("journal written")

            # Twice each: the second takes a parked sandbox (park.c), the first a cold one.
            for _ in range(2):
                result = await spawn(_spec(), sandbox=Sandbox(spawner, _plan(seen)), gate=good())
                assert result.exit_code == 0, (result.spawn_error, result.stderr.data)
                assert bytes(result.stdout.data) == b"ran\n"
            assert opened == ["journal written"] * 2

            async def fenced() -> None:
                raise CodedError(RuntimeErrorCode.CONNECTOR_UNAVAILABLE, "fenced: nothing ran")

            assert (seen / "ran").read_text() == "ran\n" * 2
            for _ in range(2):
                with pytest.raises(NotStarted) as refused:
                    await spawn(_spec(), sandbox=Sandbox(spawner, _plan(seen)), gate=fenced())
                assert isinstance(refused.value.cause, CodedError)
                assert refused.value.cause.code == RuntimeErrorCode.CONNECTOR_UNAVAILABLE
                # Its sandbox was built, then torn down unopened: its namespace is gone
                # (spawn waited for that), and nothing of the action ran.
                assert (seen / "ran").read_text() == "ran\n" * 2

            # Without a sandbox the gate is awaited before anything is started.
            with pytest.raises(NotStarted):
                await spawn(_spec(), gate=fenced())
        finally:
            spawner.close()

    asyncio.run(go())


def test_a_sandbox_that_cannot_be_built_reports_why_behind_an_open_gate(tmp_path: Path) -> None:
    """Found in review: opening the gate of a sandbox already dead (or never built)
    raised BrokenPipeError and leaked its pidfd, instead of the sandbox's own error."""

    async def good() -> None:
        await asyncio.sleep(0)

    missing = Mount(kind="bind", target="/mnt", source=str(tmp_path / "absent"))
    bad_mount = msgspec.structs.replace(_plan(tmp_path), mounts=[missing])
    # CLONE_THREAD is not a namespace: the zygote cannot build anything for it.
    unbuildable = msgspec.structs.replace(_plan(tmp_path), namespaces=NAMESPACES | 0x10000)

    async def go() -> None:
        spawner = Spawner()
        spawner.start()
        try:
            fds = len(os.listdir("/proc/self/fd"))
            for plan in (bad_mount, bad_mount, unbuildable):
                result = await spawn(_spec(), sandbox=Sandbox(spawner, plan), gate=good())
                assert result.exit_code is None and result.spawn_error, result
                assert bytes(result.stdout.data) == b""
            for _ in range(3):  # closed transports let go of their pipes a turn later
                await asyncio.sleep(0)
            assert len(os.listdir("/proc/self/fd")) == fds  # nothing of them left open
        finally:
            spawner.close()

    asyncio.run(go())
