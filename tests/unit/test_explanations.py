"""`sensorium explain`: one entry per published code, and the troubleshooting page in step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sensorium.client.cli.main import main
from sensorium.shared.diagnostics import ALL_CODES
from sensorium.shared.explanations import EXPLANATIONS, troubleshooting_markdown

ROOT = Path(__file__).resolve().parents[2]


def _published_codes() -> set[str]:
    codes: set[str] = set()
    for name in ("sensorium-os-error-codes.v1", "sensorium-runtime-error-codes.v1"):
        schema = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
        for definition in schema["$defs"].values():
            codes.update(definition["enum"])
    return codes


def test_every_published_code_is_explained_and_nothing_else() -> None:
    published = _published_codes()
    assert published == set(ALL_CODES)
    assert set(EXPLANATIONS) == published, (
        f"missing: {sorted(published - set(EXPLANATIONS))}, "
        f"unknown: {sorted(set(EXPLANATIONS) - published)}"
    )
    for code, e in EXPLANATIONS.items():
        assert e.meaning and e.causes and e.action, code


def test_the_troubleshooting_page_is_generated_from_the_table() -> None:
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    assert page == troubleshooting_markdown(), (
        "docs/troubleshooting.md is stale: regenerate it with "
        "`sensorium explain --markdown > docs/troubleshooting.md`"
    )


def test_explain_prints_the_entry_and_refuses_an_unknown_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "grant-denied"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("grant-denied: ") and "What to do (operator)" in out
    assert main(["explain", "no-such-code"]) == 2
    assert "explain --list" in capsys.readouterr().err


def test_a_cli_error_line_ends_with_the_explain_hint(tmp_path: Path) -> None:
    # No node on this state dir: the CLI's coded error names the code and the hint.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sensorium.client.cli.main",
            "--state-dir",
            str(tmp_path),
            "invoke",
            "demo.fs.stat",
            "--param",
            "path=/",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.strip().startswith("see: sensorium explain "), proc.stderr


def test_version_is_printed() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sensorium.client.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("sensorium "), proc
