"""Fixtures that run Sensorium for real: a private state directory and the supervised stack."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TEST_ACTIONS, Stack, start_stack

from sensorium.shared.paths import StatePaths


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
