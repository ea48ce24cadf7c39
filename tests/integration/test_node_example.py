"""examples/node/: a client in another language, written from the docs and schemas
alone, against a live node — catalog, sync invoke, async invoke and wait, a refusal."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from harness import Stack

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node" / "client.mjs"
NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed (apt-get install nodejs)")
def test_the_node_js_example_client_runs_every_step(stack: Stack) -> None:
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(EXAMPLE), str(stack.paths.root)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    steps = {s["step"]: s for s in map(json.loads, done.stdout.splitlines())}
    assert steps["health"]["process"] == "core"
    assert "demo.fs.stat" in steps["catalog"]["actions"]
    assert (steps["invoke"]["status"], steps["invoke"]["exit_code"]) == ("completed", 0)
    assert steps["async"] == {"step": "async", "admitted": "admitted", "final": "completed"}
    assert (steps["refused"]["status"], steps["refused"]["code"]) == (
        "rejected",
        "action-not-allowlisted",
    )
