"""The start-up trial builds a real sandbox: as root, and through a user namespace."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest

from sensorium.connectors.os.probe import Runtime
from sensorium.connectors.os.sandbox.spawner import Spawner
from sensorium.connectors.os.trial import trial


def _trial(runtime: Runtime) -> Runtime:
    async def run() -> Runtime:
        spawner = Spawner()
        spawner.start()
        try:
            return await trial(runtime, spawner)
        finally:
            spawner.close()

    return asyncio.run(run())


@pytest.mark.skipif(os.geteuid() != 0, reason="the root sandbox needs root")
def test_the_full_envelope_builds_as_root() -> None:
    result = _trial(Runtime.read())
    assert result.trial_error is None and result.sandbox
    assert result.class_state("scoped-fs-write") == ("enabled", [])


@pytest.mark.skipif(not Runtime.read().userns, reason="user namespaces are disabled on this kernel")
def test_the_user_namespace_path_builds_too() -> None:
    # What an unprivileged connector does: unshare a user namespace mapping only its
    # own ids, then the same mounts, Landlock and seccomp inside it.
    unprivileged = dataclasses.replace(Runtime.read(), root=False)
    result = _trial(unprivileged)
    assert result.trial_error is None, result.trial_error
    assert result.class_state("read-only-spawn") == ("enabled", [])
    # What needs a host-side tmpfs is reported, not pretended.
    state, gaps = result.class_state("scoped-fs-write")
    assert state == "unsupported_by_runtime" and "root" in gaps[0]


def test_a_runtime_without_mechanisms_is_honest() -> None:
    bare = dataclasses.replace(
        Runtime.read(), landlock_abi=0, trial_error="mechanisms missing", root=False
    )
    state, gaps = bare.class_state("read-only-spawn")
    assert state == "degraded" and any("egress" in g for g in gaps)
    assert bare.class_state("allowlisted-script")[0] == "unsupported_by_runtime"
    as_root = dataclasses.replace(bare, root=True)
    assert as_root.class_state("read-only-spawn")[0] == "unsupported_by_runtime"
