"""Two actions in flight at once cannot see, signal or reach each other.

The holder (tests/programs/neighbour.py ``hold``) sets up what a neighbour could
reach — a UDP listener (and a TCP one where Landlock allows the bind), a file in its
/tmp, a SysV shared-memory segment, signal handlers — and waits for the test's
release file; while it waits, a second action probes for each of them and signals
the holder's host pid. Both reports must show nothing got through. Run with the node
as root and as an ordinary user, since each builds its namespaces differently (the
id maps a root or an unprivileged zygote writes).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import NODE_UID, Stack, python_action, running_stack

from sensorium.client import Client

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="starting a node as root and as another uid needs root"
)
WAIT_S = 30.0


@pytest.fixture(scope="module", params=["root", "user"])
def node_user(request: pytest.FixtureRequest) -> int | None:
    return None if request.param == "root" else NODE_UID


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """Where the release file appears: outside /tmp (each action has its own), readable."""
    d = Path(tempfile.mkdtemp(prefix="neighbours-", dir="/var/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(node_user: int | None, shared: Path) -> Iterator[Stack]:
    release = str(shared / "release")
    actions = [
        python_action("nb.hold", "neighbour.py", ["hold", release]),
        python_action(
            "nb.probe", "neighbour.py", ["probe", "{{pid}}"], {"pid": {"type": "integer"}}
        ),
    ]
    with running_stack(actions, user=node_user) as s:
        yield s


def _wait_for_marker(pid: int) -> None:
    """The holder writes its marker last: once the host sees it through the holder's own
    root, everything a neighbour could reach is in place."""
    marker = Path(f"/proc/{pid}/root/tmp/neighbour-marker")
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if marker.exists():
            return
        time.sleep(0.02)
    raise AssertionError("the holder never set up")


def test_a_concurrent_action_cannot_see_signal_or_reach_another(stack: Stack, shared: Path) -> None:
    (shared / "release").unlink(missing_ok=True)
    held: dict[str, Any] = {}

    def hold() -> None:
        with Client(state_dir=str(stack.paths.root)) as c:
            held["outcome"] = c.invoke("nb.hold", {}, timeout_ms=int(WAIT_S * 2000))

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        pid = stack.action_pid("neighbour.py hold")
        _wait_for_marker(pid)
        with Client(state_dir=str(stack.paths.root)) as c:
            probed = c.invoke("nb.probe", {"pid": pid})
    finally:
        (shared / "release").write_text("go")
        (shared / "release").chmod(0o644)
        holder.join(WAIT_S * 2)
    assert probed.status == "completed", probed
    seen = json.loads(probed.stdout.text)
    # Its own init is all it sees besides itself; the holder is nowhere.
    assert not [c for c in seen.pop("others_in_proc") if "neighbour.py" in c], seen
    assert seen.pop("kill") == errno.ESRCH
    seen.pop("kill_all")  # whatever it hit, the holder's report says it was not the holder
    assert seen.pop("marker") is False
    assert seen.pop("shm") == -1
    assert seen.pop("abstract unix") == errno.EPERM  # no AF_UNIX socket at all
    # Loopback is down in its own network namespace: no route anywhere (and Landlock
    # refuses a TCP connect to an undeclared port before that).
    assert all(v in (errno.ENETUNREACH, errno.EACCES) for v in seen.values()), seen
    outcome = held["outcome"]
    assert outcome.status == "completed", outcome
    report = json.loads(outcome.stdout.text)
    assert report == {
        "released": True,
        "signals": [],
        "shm": True,
        "accepted": False,
        "datagram": False,
        "marker": True,
    }
