"""The README's promises: its Python examples run against a live node, and CI runs its
test command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from harness import Stack

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_python_examples_run(stack: Stack) -> None:
    blocks = _blocks("python")
    assert len(blocks) >= 2
    env = {**os.environ, "SENSORIUM_STATE_DIR": str(stack.paths.root)}
    for code in blocks:
        res = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert res.returncode == 0, f"{code}\n---\n{res.stderr}"
    first = subprocess.run(
        [sys.executable, "-c", blocks[0]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert "parameters-invalid $.parameters.lines" in first.stdout


def test_first_screen_holds_the_two_commands_and_ci_runs_the_test_one() -> None:
    first_screen = README.split("---", 1)[0]
    commands = _blocks("sh")
    assert len(commands) >= 2 and all(c.strip() in first_screen for c in commands[:2])
    run_cmd, test_cmd = (c.strip() for c in commands[:2])
    assert run_cmd.endswith("sensorium up")
    ci = (REPO / ".ci" / "run").read_text()
    assert test_cmd in ci
