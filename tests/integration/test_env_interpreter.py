"""Seed 048's `"interpreter": "/usr/bin/env"` on a running node (issue 18, item 7): the
node resolves the program env names once, at load, on a fixed search path, and the
spawn runs that program itself — env never runs, $PATH is never read."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import running_stack

SCRIPT = """\
import json, os, sys
params = json.loads(sys.argv[sys.argv.index('--params-json') + 1])
try:
    exe = os.readlink('/proc/self/exe')
except OSError as exc:
    exe = f'unreadable: {exc}'
print(json.dumps({'exe': exe, 'argv0': sys.argv[0], 'text': params['text']}))
"""


@pytest.fixture(scope="module")
def scripts() -> Iterator[Path]:
    # World-readable and not under /tmp (every action sees its own empty /tmp).
    d = Path(tempfile.mkdtemp(prefix="sensorium-env-", dir="/var/tmp"))
    d.chmod(0o755)
    (d / "report.py").write_text(SCRIPT)
    (d / "report.py").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_an_env_interpreter_runs_the_program_resolved_at_load(scripts: Path) -> None:
    script = str(scripts / "report.py")
    action = {
        "action_id": "seed.env.report",
        "class": "allowlisted-script",
        "group": "research",
        "executable": {
            "kind": "script",
            "path": script,
            "interpreter": "/usr/bin/env",
            "argv_shape": ["python3", script, "--params-json", "{{params_json}}"],
        },
        "script": {"allowed_roots": [str(scripts)]},
        "parameters_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": False,
        },
        "result_contract": {"stdout_format": "json"},
    }
    with running_stack([action]) as stack:
        with stack.client() as client:
            out = client.invoke("seed.env.report", {"text": "hi"})
        assert out.status == "completed", out
        ran = json.loads(out.stdout.text)
        assert ran["text"] == "hi"
        resolved = os.path.realpath("/usr/bin/python3")
        if not ran["exe"].startswith("unreadable"):
            assert ran["exe"] == resolved  # python itself, not env
        # `catalog show` names what env resolved to and its digest.
        shown = stack.cli("catalog", "show")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert f"/usr/bin/env python3 → {resolved} (sha256 " in shown.stdout
