"""ruff (lint + format) and mypy --strict over the packages: part of the test command."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ["shared", "core", "connectors", "poller", "supervisor", "client", "deploy"]


def _tool(name: str) -> list[str]:
    return [sys.executable, "-m", name]


def test_ruff_lint() -> None:
    res = subprocess.run(
        [*_tool("ruff"), "check", "--output-format", "concise", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format() -> None:
    res = subprocess.run(
        [*_tool("ruff"), "format", "--check", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_strict() -> None:
    # mypy needs the folders under their import name; a symlink gives it that view.
    root = Path(tempfile.mkdtemp(prefix="mypy-"))
    try:
        (root / "sensorium").symlink_to(REPO)
        args = [arg for pkg in PACKAGES for arg in ("-p", f"sensorium.{pkg}")]
        res = subprocess.run(
            [
                *_tool("mypy"),
                "--config-file",
                str(REPO / "pyproject.toml"),
                "--cache-dir",
                str(root / ".cache"),
                *args,
            ],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stdout + res.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)
