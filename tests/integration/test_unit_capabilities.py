"""The connector's systemd unit grants enough: every class works for a root node whose
bounding set is exactly the unit's CapabilityBoundingSet= (as systemd would apply it).

The class tests of test_classes.py run again here, on a root node started through
``setpriv --bounding-set -all,+<the unit's capabilities>``; its sandboxes then go
through a user namespace, as they do under the unit. (The unit's seccomp-based
options, RestrictNamespaces= and SystemCallFilter=, need systemd itself: the opt-in
systemd suite boots the units.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from harness import Stack, running_stack, sensorium_command
from integration import test_classes
from integration.test_classes import (  # noqa: F401  (collected here, with this module's fixtures)
    test_c1_runs_unprivileged_as_pid_in_its_own_namespace,
    test_c2_runs_the_sealed_script_with_canonical_params,
    test_c3_commits_writes_and_lists_them,
    test_c4_a_server_that_resets_after_answering_is_no_violation,
    test_c4_reaches_the_declared_endpoint_through_the_relay,
    test_c5_promotes_artifacts_into_the_lane,
    test_no_action_of_any_class_reaches_the_node_s_state,
    test_the_ledger_shows_every_class_enabled,
    world,
)

from sensorium.deploy import units

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="starting a node as root needs root"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is missing"),
]


def unit_capabilities() -> list[str]:
    text = units.committed("systemd", "sensorium-os.service").decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("CapabilityBoundingSet=")]
    return line.partition("=")[2].split()


UNIT_CAPS = [
    "setpriv",
    "--bounding-set",
    "-all," + ",".join("+" + c.removeprefix("CAP_").lower() for c in unit_capabilities()),
    "--",
]


@pytest.fixture(scope="module")
def node_user() -> None:
    return None  # root, as the unit runs it


@pytest.fixture(scope="module")
def action_uid() -> int:
    return test_classes.SANDBOX_UID


@pytest.fixture(scope="module")
def classes(world: dict[str, Any]) -> Iterator[Stack]:  # noqa: F811
    """test_classes' stack, started under the unit's bounding set."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return running_stack(*args, **kwargs, wrap=UNIT_CAPS)

    build = test_classes.classes._get_wrapped_function()  # type: ignore[attr-defined]
    with mock.patch.object(test_classes, "running_stack", wrapped):
        yield from build(world, None)


def test_the_unit_grants_neither_sys_admin_nor_net_admin() -> None:
    caps = set(unit_capabilities())
    assert not {"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_MKNOD", "CAP_SYS_RESOURCE"} & caps
    assert {"CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_KILL"} <= caps


def test_doctor_finds_every_class_enforceable_under_the_unit_s_capabilities() -> None:
    command, env, preexec = sensorium_command(wrap=UNIT_CAPS)
    res = subprocess.run(
        [*command, "doctor"],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=preexec,
        cwd="/",
        timeout=120,
    )
    assert "tier: namespaces" in res.stdout, res.stdout + res.stderr
    enabled = [ln for ln in res.stdout.splitlines() if ln.startswith("  enabled")]
    assert len(enabled) == 5, res.stdout
