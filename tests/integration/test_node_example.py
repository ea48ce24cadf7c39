"""examples/node/: a client in another language, written from the docs and schemas
alone, against a live node — catalog, sync invoke, async invoke and wait, a refusal —
over ipc and over tcp with CURVE (its own CurveZMQ, examples/node/curve.mjs)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from harness import TEST_ACTIONS, Stack, free_port, keys_cli, start_stack

from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.curvekeys import CurveStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node" / "client.mjs"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(
    NODE is None, reason="Node.js is not installed (apt-get install nodejs)"
)


def _node(*args: str) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    return subprocess.run(
        [NODE, str(EXAMPLE), *args], capture_output=True, text=True, timeout=180, check=False
    )


def _run(*args: str) -> dict[str, dict[str, Any]]:
    done = _node(*args)
    assert done.returncode == 0, done.stderr
    return {s["step"]: s for s in map(json.loads, done.stdout.splitlines())}


def _check_every_step(steps: dict[str, dict[str, Any]], refusal: str) -> None:
    assert steps["health"]["process"] == "core"
    assert "demo.fs.stat" in steps["catalog"]["actions"]
    assert (steps["invoke"]["status"], steps["invoke"]["exit_code"]) == ("completed", 0)
    assert steps["async"] == {"step": "async", "admitted": "admitted", "final": "completed"}
    assert (steps["refused"]["status"], steps["refused"]["code"]) == ("rejected", refusal)


@needs_node
def test_the_node_js_example_client_runs_every_step(stack: Stack) -> None:
    _check_every_step(_run(str(stack.paths.root)), "action-not-allowlisted")


@pytest.fixture(scope="module")
def tcp_stack() -> Iterator[Stack]:
    """Core on tcp (CURVE), with a client key `nodejs` granted the demo file actions."""
    paths = StatePaths(Path(tempfile.mkdtemp(prefix="st-", dir="/tmp")))
    paths.ensure()
    root = str(paths.root)
    keys_cli(root, "curve", "init")
    keys_cli(root, "client", "add", "nodejs", "--grant", "demo.filesystem")
    stack = start_stack(
        paths, TEST_ACTIONS, {"endpoints": {"core": f"tcp://127.0.0.1:{free_port()}"}}
    )
    try:
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(paths.root, ignore_errors=True)


@needs_node
def test_the_node_js_example_client_runs_every_step_over_tcp_and_curve(tcp_stack: Stack) -> None:
    endpoint = json.loads(tcp_stack.paths.node_config.read_text())["endpoints"]["core"]
    key = CurveStore(tcp_stack.paths).issued_dir / "nodejs.key_secret"
    steps = _run(endpoint, str(key))
    # An action outside the key's grant is refused as such, whether it exists or not.
    _check_every_step(steps, "grant-denied")
    # Over CURVE the node answers for this key's grant only: the demo file actions.
    assert all(a.startswith("demo.fs.") for a in steps["catalog"]["actions"])


@needs_node
def test_the_node_js_example_is_told_when_its_key_is_not_allowed(
    tcp_stack: Stack, tmp_path: Path
) -> None:
    endpoint = json.loads(tcp_stack.paths.node_config.read_text())["endpoints"]["core"]
    issued = (CurveStore(tcp_stack.paths).issued_dir / "nodejs.key_secret").read_text()
    public, secret = (k.decode() for k in zmq.curve_keypair())
    stranger = re.sub(r'(?m)^(\s+public-key = )"[^"]*"', f'\\1"{public}"', issued)
    stranger = re.sub(r'(?m)^(\s+secret-key = )"[^"]*"', f'\\1"{secret}"', stranger)
    key = tmp_path / "stranger.key_secret"
    key.write_text(stranger)
    done = _node(endpoint, str(key))
    # The node's ZAP handler refuses the handshake with an ERROR command: said, not hung.
    assert done.returncode == 1
    assert "refused by the node" in done.stderr, done.stderr
