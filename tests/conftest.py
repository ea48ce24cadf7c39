"""Fixtures that run Sensorium for real: a private state directory and the supervised stack."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TEST_ACTIONS, Stack, start_stack

from sensorium.shared.paths import StatePaths

_janitor: subprocess.Popen[str] | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Start the janitor (tests/janitor.py) before anything is created: whatever ends
    this run, even SIGKILL, its nodes are stopped and its temporary dirs removed."""
    global _janitor
    if _janitor is not None:
        return
    token = secrets.token_hex(8)
    _janitor = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("janitor.py")), token],
        stdin=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != "SENSORIUM_TEST_RUN"},
    )
    # Every process this run starts inherits the token, whoever it runs as.
    os.environ["SENSORIUM_TEST_RUN"] = token
    real_mkdtemp = tempfile.mkdtemp
    pipe = _janitor.stdin
    assert pipe is not None

    def tracked_mkdtemp(*args: object, **kwargs: object) -> str:
        made: str = real_mkdtemp(*args, **kwargs)  # type: ignore[call-overload]
        pipe.write(f"dir {made}\n")
        pipe.flush()
        return made

    # Every temporary dir a test makes, wherever it makes it (state dirs are short
    # paths in /tmp for AF_UNIX, runtime copies in /var/tmp for other uids).
    tempfile.mkdtemp = tracked_mkdtemp  # type: ignore[assignment]


@pytest.fixture
def state_dir() -> Iterator[StatePaths]:
    # Short, because AF_UNIX socket paths are limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    try:
        yield StatePaths(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def stack(state_dir: StatePaths) -> Iterator[Stack]:
    s = start_stack(state_dir, TEST_ACTIONS)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()
