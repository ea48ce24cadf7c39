"""The tier and the canaries build real sandboxes: the tier decides, the probe explains."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
from pathlib import Path

import pytest

from sensorium.connectors.os.envelope.builder import EnvelopeBuilder
from sensorium.connectors.os.envelope.canary import BASE, Canaries, choose_tier
from sensorium.connectors.os.envelope.probe import Runtime
from sensorium.connectors.os.run.sandbox import landlock
from sensorium.connectors.os.run.sandbox.grants import CarveError, carve
from sensorium.connectors.os.run.sandbox.spawner import Spawner
from sensorium.shared.config import NodeConfig
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.fs_policy import FsPolicy


def _tier(runtime: Runtime) -> tuple[Runtime, str | None]:
    """The tier this runtime reaches, and the BASE canary's verdict in it."""

    async def run() -> tuple[Runtime, str | None]:
        spawner = Spawner()
        spawner.start()
        root = Path(tempfile.mkdtemp(prefix="cn-", dir="/tmp"))
        paths = StatePaths(root)
        paths.ensure()
        builder = EnvelopeBuilder(paths, NodeConfig(), runtime, FsPolicy(schemaVersion=2), spawner)
        builder.start()
        try:
            chosen = await choose_tier(runtime, builder)
            return chosen, await Canaries(builder).check(BASE)
        finally:
            spawner.close()

    return asyncio.run(run())


@pytest.mark.skipif(os.geteuid() != 0, reason="the root sandbox needs root")
def test_the_namespace_tier_builds_as_root() -> None:
    chosen, verdict = _tier(Runtime.read())
    assert (chosen.tier, verdict) == ("namespaces", None), chosen.why_not()
    assert chosen.class_state("scoped-fs-write") == ("enabled", [])


def test_a_runtime_without_landlock_enables_nothing_and_says_why() -> None:
    bare = dataclasses.replace(
        Runtime.read(), landlock_abi=0, landlock_error="landlock_create_ruleset: [EPERM]"
    )
    chosen, _verdict = _tier(bare)
    assert chosen.tier == "none"
    for cls in ("read-only-spawn", "allowlisted-script", "scoped-fs-write"):
        state, gaps = chosen.class_state(cls)
        assert state == "unsupported_by_runtime" and "EPERM" in gaps[0], gaps


def test_the_landlock_tier_enables_only_what_it_can_hold_whole() -> None:
    tier = dataclasses.replace(Runtime.read(), tier="landlock")
    assert tier.class_state("read-only-spawn") == ("enabled", [])
    assert tier.class_state("allowlisted-script") == ("enabled", [])
    for cls in ("scoped-fs-write", "egress-network-spawn", "artifact-producing-spawn"):
        state, gaps = tier.class_state(cls)
        assert state == "unsupported_by_runtime" and "namespace" in gaps[0], gaps


def test_landlock_probe_never_raises() -> None:
    abi, why = landlock.probe()
    assert (abi > 0) == (why is None)


def test_carving_leaves_out_the_hidden_tree_and_links_into_it(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "secret" / "deep").mkdir(parents=True)
    (tmp_path / "b" / "open").mkdir()
    (tmp_path / "b" / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "b" / "secret")
    grants = carve([str(tmp_path)], [str(tmp_path / "b" / "secret")])
    assert sorted(Path(g).relative_to(tmp_path).as_posix() for g in grants) == [
        "a",
        "b/file",
        "b/open",
    ]
    # A grant inside the hidden tree goes whole; one beside it stays.
    assert carve([str(tmp_path / "b" / "secret" / "deep"), "/usr"], [str(tmp_path / "b")]) == [
        "/usr"
    ]
    with pytest.raises(CarveError):
        carve(["/"], ["/"])
