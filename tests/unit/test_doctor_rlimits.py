"""`sensorium doctor` says when an action's rlimit (sandbox.*) is above the hard limit
it would have to be raised past: no capability does that inside a user namespace, and
the systemd unit holds no CAP_SYS_RESOURCE, so every action would fail to start."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sensorium.connectors.os.envelope import doctor
from sensorium.shared.config import NodeConfig, SandboxConfig

INF = resource.RLIM_INFINITY


def _hard(limits: dict[int, int]) -> Callable[[int], tuple[int, int]]:
    return lambda which: (0, limits.get(which, INF))


def test_within_the_hard_limits_is_ok() -> None:
    sb = NodeConfig().sandbox
    check = doctor.rlimit_check(
        sb,
        can_raise=False,
        getrlimit=_hard(
            {
                resource.RLIMIT_NOFILE: sb.max_open_files,
                resource.RLIMIT_NPROC: sb.max_processes,
            }
        ),
    )
    assert check.ok and check.fix is None


def test_above_a_hard_limit_names_the_limit_and_the_fix() -> None:
    sb = SandboxConfig(max_open_files=4096, max_processes=512)
    check = doctor.rlimit_check(
        sb,
        can_raise=False,
        getrlimit=_hard({resource.RLIMIT_NOFILE: 1024, resource.RLIMIT_NPROC: 100}),
    )
    assert not check.ok and check.blocking
    assert "sandbox.max_open_files = 4096 > hard limit 1024" in check.detail
    assert "sandbox.max_processes = 512 > hard limit 100" in check.detail
    assert "user namespace" in check.detail
    assert check.fix is not None
    assert "raise LimitNOFILE=/LimitNPROC= in the unit" in check.fix
    assert "lower sandbox.max_open_files/sandbox.max_processes" in check.fix
    # Every class's canary ran, yet the diagnosis fails: no action could start.
    d = doctor.Diagnosis(uid=0, tier="namespaces", checks=[check], classes={"x": None})
    assert not d.healthy


def test_cap_sys_resource_raises_it_where_no_user_namespace_is_used() -> None:
    sb = SandboxConfig(max_open_files=4096)
    check = doctor.rlimit_check(
        sb, can_raise=True, userns=False, getrlimit=_hard({resource.RLIMIT_NOFILE: 1024})
    )
    assert check.ok and "CAP_SYS_RESOURCE" in check.detail


def test_the_cli_checks_the_node_s_own_config(tmp_path: Path) -> None:
    """End to end: a node.json asking for more open files than the hard limit."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == INF or hard >= 1 << 30:
        hard = 1 << 16  # set a lower one for the child below
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "node.json").write_text(
        json.dumps({"sandbox": {"max_open_files": hard + 1}})
    )

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sensorium.client.cli.main",
            "--state-dir",
            str(tmp_path),
            "doctor",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lower,
        env={**os.environ},
    )
    doc = json.loads(res.stdout)
    if os.geteuid() == 0 and doc["tier"] != "namespaces":
        pytest.skip("root without a user namespace raises it with CAP_SYS_RESOURCE")
    (check,) = [c for c in doc["checks"] if c["name"] == "action rlimits"]
    assert check["ok"] is False, doc
    assert f"sandbox.max_open_files = {hard + 1} > hard limit {hard}" in check["detail"]
    assert res.returncode == 1
