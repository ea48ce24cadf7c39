"""Every coded CLI error ends with its next step, ``see: sensorium explain CODE``, and
that command knows the code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import Stack

CLI = [sys.executable, "-m", "sensorium.client.cli.main"]


def _fails_with_hint(state_dir: str, *args: str) -> str:
    """Run ``sensorium ARGS``; assert it failed and its last line names the code."""
    env = {**os.environ, "SENSORIUM_STATE_DIR": state_dir}
    res = subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode != 0, res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) >= 2, (args, res.stderr)
    first, last = lines[0], lines[-1]
    code = first.split(":")[1].strip()  # sensorium: CODE: message
    assert last == f"  see: sensorium explain {code}", res.stderr
    explained = subprocess.run(
        [*CLI, "explain", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert explained.returncode == 0 and explained.stdout.startswith(f"{code}: "), explained
    return code


def test_errors_without_a_node_end_with_the_explain_hint(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    assert _fails_with_hint(state, "invoke", "demo.system.uptime") == "core-unavailable"
    assert _fails_with_hint(state, "actions") == "core-unavailable"


def test_refusals_of_a_live_node_end_with_the_explain_hint(stack: Stack) -> None:
    root = str(stack.paths.root)
    assert _fails_with_hint(root, "invoke", "demo.nope") == "action-not-allowlisted"
    assert (
        _fails_with_hint(root, "invoke", "demo.fs.stat", "--param", "path=relative")
        == "parameters-invalid"
    )
    assert _fails_with_hint(root, "ops", "wait", "nope") == "operation-unknown"
