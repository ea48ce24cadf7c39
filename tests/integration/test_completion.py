"""Shell completion, through the protocol a shell really speaks: argcomplete's
environment (``_ARGCOMPLETE``, ``COMP_LINE``, ``COMP_POINT``) in, candidates out to
``_ARGCOMPLETE_STDOUT_FILENAME``; and the script ``sensorium completion`` prints,
sourced by a real bash."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from harness import Stack

from sensorium.shared.explanations import EXPLANATIONS

CLI = [sys.executable, "-m", "sensorium.client.cli.main"]


def _complete(line: str, state_dir: str) -> list[str]:
    """What TAB after ``line`` offers (argcomplete's bash protocol, IFS a newline)."""
    with tempfile.NamedTemporaryFile("r", suffix=".complete") as out:
        env = {
            **os.environ,
            "SENSORIUM_STATE_DIR": state_dir,
            "_ARGCOMPLETE": "1",
            "_ARGCOMPLETE_IFS": "\n",
            "_ARGCOMPLETE_STDOUT_FILENAME": out.name,
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "COMP_TYPE": "9",  # TAB
        }
        res = subprocess.run(CLI, env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        # A TAB prints nothing on the terminal: no log line, no warning.
        assert res.stdout == "" and res.stderr == "", (res.stdout, res.stderr)
        return [c.strip() for c in out.read().split("\n") if c.strip()]


def test_subcommands_options_and_codes_complete_without_a_node(tmp_path: Path) -> None:
    state = str(tmp_path / "none")
    assert {"explain", "completion"} <= set(_complete("sensorium ", state))
    assert _complete("sensorium ex", state) == ["explain"]
    assert "--version" in _complete("sensorium --ver", state)
    assert _complete("sensorium explain grant-d", state) == ["grant-denied"]
    every = _complete("sensorium explain ", state)
    assert {c for c in every if not c.startswith("-")} == set(EXPLANATIONS)
    assert _complete("sensorium completion ", state) == ["bash", "zsh", "fish"]
    # No node: no action ids, quickly and silently, and no state dir made by a TAB.
    assert _complete("sensorium invoke demo.", state) == []
    assert not (tmp_path / "none").exists()


def test_action_ids_and_grants_complete_from_the_live_catalog(stack: Stack) -> None:
    root = str(stack.paths.root)
    assert _complete("sensorium invoke test.echo", root) == ["test.echo-args"]
    assert "test.inspect" in _complete("sensorium ledger test.", root)
    assert "test.echo-args" in _complete("sensorium logs --action test.", root)
    grants = _complete("sensorium keys client add bot --grant ", root)
    assert {"test.echo-args", "\\*", "audit"} <= set(grants)  # bash-escaped *


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_bash_script_registers_sensorium_when_sourced() -> None:
    script = subprocess.run(
        [*CLI, "completion", "bash"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    res = subprocess.run(
        ["bash", "-c", f"{script}\ncomplete -p sensorium"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "sensorium" in res.stdout and "-F" in res.stdout


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_name_sensorium(shell: str) -> None:
    script = subprocess.run(
        [*CLI, "completion", shell], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "sensorium" in script and "_ARGCOMPLETE" in script
