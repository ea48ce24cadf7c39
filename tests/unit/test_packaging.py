"""The distribution installs one namespace, `sensorium`, with its data, importable anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed() -> Path:
    target = Path(tempfile.mkdtemp(prefix="pkg-"))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return target


def test_only_the_sensorium_namespace_is_installed(installed: Path) -> None:
    top = {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")}
    assert top - {"bin"} == {"sensorium"}, top
    assert not {"core", "shared", "poller", "connectors", "tests", "bench"} & top


def test_data_files_ship_with_the_package(installed: Path) -> None:
    pkg = installed / "sensorium"
    assert (pkg / "connectors/os/factory/sensorium-os.json").is_file()
    schemas = list((pkg / "schemas").glob("*.schema.json"))
    assert len(schemas) >= 10
    assert not (pkg / "tests").exists()


def test_importable_from_another_directory(installed: Path) -> None:
    code = (
        "import sensorium.core.service, sensorium.connectors.os.service, "
        "sensorium.poller.service, sensorium.supervisor.service, sensorium.client; "
        "print(sensorium.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(installed)}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(str(installed))
