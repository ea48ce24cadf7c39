"""One node per state directory: a second core, connector or poller started by hand on a
state dir that a node serves stops at once, naming the holder; the node keeps serving."""

from __future__ import annotations

import subprocess

import pytest
from harness import PYTHON, Stack

MODULES = {
    "core": "sensorium.core",
    "connector": "sensorium.connectors.os",
    "poller": "sensorium.poller",
}


@pytest.mark.parametrize("role", sorted(MODULES))
def test_a_second_process_of_a_role_is_refused_and_the_node_keeps_serving(
    stack: Stack, role: str
) -> None:
    pid = stack.pids()[role]
    res = subprocess.run(
        [PYTHON, "-m", MODULES[role], "--state-dir", str(stack.paths.root)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 78, res.stderr
    assert f"pid {pid}" in res.stderr and "one node per state directory" in res.stderr
    # The node did not notice: same processes, still answering.
    assert stack.pids()[role] == pid
    with stack.client() as c:
        out = c.invoke("test.echo-args", {"value": "still here"})
    assert out.status == "completed" and "still here" in out.stdout.text
