"""The start-up trial: build one full sandbox and run the smallest program in it.

A kernel can list a mechanism and still refuse it (a container's seccomp profile
forbids ``unshare``; an LSM stack rejects Landlock). Running ``true`` under the
whole C1 envelope once is the only honest proof; its verdict is the probe's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil

from sensorium.connectors.os.envelope import NAMESPACES
from sensorium.connectors.os.launcher import Sandbox, SpawnSpec, spawn
from sensorium.connectors.os.probe import Runtime
from sensorium.connectors.os.sandbox.plan import Landlock, Mount, Plan
from sensorium.connectors.os.sandbox.spawner import Spawner
from sensorium.shared.config import SandboxConfig

TRIAL_TIMEOUT_S = 10.0


async def trial(
    runtime: Runtime, spawner: Spawner, sandbox: SandboxConfig | None = None
) -> Runtime:
    """``runtime`` with ``trial_error`` set: None when the sandbox works here."""
    true = shutil.which("true") or "/bin/true"
    if not (runtime.namespaces and runtime.landlock_abi >= 1 and runtime.seccomp):
        return dataclasses.replace(runtime, trial_error="mechanisms missing")
    cfg = sandbox or SandboxConfig()
    # The ids actions will run as: the trial proves exactly that envelope.
    uid, gid = (cfg.uid, cfg.gid) if runtime.root else (os.getuid(), os.getgid())
    plan = Plan(
        executable=true,
        argv=["true"],
        env={},
        cwd="/tmp",
        namespaces=NAMESPACES,
        user_namespace=not runtime.root,
        uid=uid,
        gid=gid,
        mounts=[Mount(kind="tmpfs", target="/tmp", size_bytes=65536, uid=uid, gid=gid)],
        landlock=Landlock(read=["/"], full=["/tmp", "/dev/null"]),
        seccomp=True,
    )
    spec = SpawnSpec(
        executable=true,
        argv=["true"],
        env={},
        cwd="/tmp",
        timeout_s=TRIAL_TIMEOUT_S,
        stdout_cap=4096,
        stderr_cap=4096,
        grace_s=1.0,
    )
    try:
        run = await asyncio.wait_for(spawn(spec, None, Sandbox(spawner, plan)), 30)
    except Exception as exc:
        return dataclasses.replace(runtime, trial_error=f"{type(exc).__name__}: {exc}")
    if run.spawn_error is not None:
        return dataclasses.replace(runtime, trial_error=run.spawn_error)
    if run.exit_code != 0:
        detail = run.stderr.data.decode(errors="replace").strip()[:200]
        return dataclasses.replace(
            runtime, trial_error=f"true exited {run.exit_code} {run.signal}: {detail}"
        )
    return dataclasses.replace(runtime, trial_error=None)
