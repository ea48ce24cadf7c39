"""Where the peers (huey, circus) live: the running interpreter or the peers venv.

Peers always run in interpreters of their own (subprocesses), so whichever of the two
has them, the measured path is the same. Nothing here imports sensorium.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS_DIR = Path(os.environ.get("SENSORIUM_BENCH_PEERS", "/tmp/sensorium-bench-peers"))
PEER_MODULES = ("huey", "circus")
INSTALL_HINT = "install the peers with `bench/peers.sh` (or `pip install -e '.[bench]'`)"


def _imports(python: Path, modules: tuple[str, ...]) -> bool:
    try:
        res = subprocess.run(
            [str(python), "-c", "import " + ", ".join(modules)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def peer_python(*modules: str) -> str | None:
    """An interpreter that imports every one of ``modules`` (this one first), or None."""
    wanted = modules or PEER_MODULES
    for python in (Path(sys.executable), PEERS_DIR / "bin" / "python"):
        if python.exists() and _imports(python, wanted):
            return str(python)
    return None


def ensure_peers(timeout_s: float = 300) -> str:
    """The peers' interpreter, installing them with peers.sh first if none has them."""
    found = peer_python()
    if found is not None:
        return found
    print(f"installing the peers into {PEERS_DIR} (bench/peers.sh) …", file=sys.stderr, flush=True)
    subprocess.run(
        ["bash", str(HERE / "peers.sh")],
        env={**os.environ, "PYTHON": sys.executable},
        stdin=subprocess.DEVNULL,
        check=True,
        timeout=timeout_s,
    )
    found = peer_python()
    if found is None:
        raise RuntimeError(f"bench/peers.sh ran but no interpreter imports {PEER_MODULES}")
    return found
