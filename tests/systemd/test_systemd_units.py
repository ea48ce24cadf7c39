"""The installed units under a real systemd (opt-in: ``pytest -m systemd``).

systemd boots as PID 1 in a Podman container (``--systemd=always``) whose root is
deploy/container's Debian base image with this host's /usr, Python and checkout
mounted read-only; ``sensorium install-units`` writes the units inside, as an
operator would. Skipped, with the reason, where Podman, root or the base image is
missing (``sudo deploy/container/build-base.sh`` makes it once).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import unprivileged_runtime

pytestmark = [pytest.mark.systemd, pytest.mark.slow]

IMAGE = "localhost/sensorium-base:bookworm"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
REPO = Path(__file__).resolve().parents[2]
STATE = "/var/lib/sensorium"
UNITS = ("sensorium-os.service", "sensorium-core.service", "sensorium-poller.service")


class Box:
    """The running container: ``sh`` runs a shell command in it (as ``user``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sh(
        self, command: str, *, user: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        argv = [*PODMAN, "exec"]
        if user is not None:
            argv += ["--user", user, "--env", "XDG_RUNTIME_DIR=/run/user/1000"]
        else:  # root's `sensorium` is this test run's (its venv's console script)
            argv += ["--env", f"PATH={Path(sys.prefix) / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"]
        argv += ["--env", f"SENSORIUM_STATE_DIR={STATE}", self.name, "sh", "-c", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def ok(self, command: str, **kw: object) -> str:
        res = self.sh(command, **kw)  # type: ignore[arg-type]
        assert res.returncode == 0, f"{command}\n{res.stdout}\n{res.stderr}"
        return res.stdout

    def states(self, *units: str, user: str | None = None) -> list[str]:
        ctl = "systemctl --user" if user else "systemctl"
        out = self.sh(f"{ctl} show -p ActiveState --value {' '.join(units)}", user=user)
        return out.stdout.split()

    def main_pid(self, unit: str) -> int:
        return int(self.ok(f"systemctl show -p MainPID --value {unit}").strip())

    def wait(self, predicate: object, polls: int = 600, what: str = "") -> None:
        for _ in range(polls):  # bounded by count; each poll is one podman exec
            if predicate():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise AssertionError(f"not reached: {what}")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (systemd as PID 1 in a Podman container)"
    if shutil.which("podman") is None:
        return "needs podman (apt-get install podman)"
    found = subprocess.run([*PODMAN, "image", "exists", IMAGE], check=False)
    if found.returncode != 0:
        return f"needs the base image {IMAGE}: sudo deploy/container/build-base.sh"
    if not Path("/lib/systemd/systemd").exists():
        return "needs systemd on this host (its /usr is the container's)"
    return None


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    python, runtime = unprivileged_runtime()
    name = f"sensorium-systemd-{os.getpid()}"
    mounts = ["/usr", sys.base_prefix, sys.prefix, str(REPO), str(runtime)]
    run = [
        *PODMAN, "run", "-d", "--rm", "--name", name, "--systemd=always",
        "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
        *(a for m in dict.fromkeys(mounts) for a in ("-v", f"{m}:{m}:ro")),
        IMAGE, "/lib/systemd/systemd",
    ]  # fmt: skip
    subprocess.run(run, check=True, capture_output=True, timeout=120)
    b = Box(name)
    try:
        b.wait(
            lambda: b.sh("systemctl is-system-running").stdout.strip() in ("running", "degraded"),
            what="systemd up",
        )
        b.ok("sensorium install-units --systemd && systemctl daemon-reload")
        # An ordinary user with a user manager and a Python of their own (the
        # world-readable runtime copy of this checkout and its libraries).
        b.ok("useradd -m -u 1000 op && systemctl start user@1000.service")
        b.ok(
            f"{python} -m venv /home/op/venv && echo {runtime} > "
            "/home/op/venv/lib/python3.11/site-packages/sensorium-runtime.pth && "
            "chown -R op:op /home/op/venv"
        )
        yield b
    finally:
        subprocess.run([*PODMAN, "rm", "-f", name], capture_output=True, check=False)


def test_start_returns_when_all_three_are_ready_and_a_directive_runs(box: Box) -> None:
    box.ok("systemctl start sensorium.target")
    assert box.states(*UNITS) == ["active"] * 3  # no polling: start waited for READY=1
    out = box.ok("sensorium invoke demo.system.uptime")
    assert out.startswith("completed")
    status = box.ok("sensorium status")
    assert "systemd system units" in status and status.count("ready") >= 3, status


def test_reload_keeps_the_pid(box: Box) -> None:
    box.ok("systemctl start sensorium.target")
    before = box.main_pid("sensorium-core.service")
    box.ok("systemctl reload sensorium-core.service")
    assert box.main_pid("sensorium-core.service") == before


def test_stop_returns_only_after_all_three_drained_with_nothing_in_doubt(box: Box) -> None:
    box.ok("systemctl start sensorium.target")
    # Eight directives that each walk /usr for a few seconds, in flight at the stop.
    box.ok(
        "rm -f /tmp/inv*; for i in 1 2 3 4 5 6 7 8; do (sensorium invoke demo.fs.find-large "
        "--param path=/usr --param min_mib=500 > /tmp/inv$i 2>&1; echo rc=$? >> /tmp/inv$i) & "
        "done; sleep 0.2; true"
    )
    inflight = (
        f"{sys.executable} -c 'from sensorium.client import Client; "
        f'print(Client(state_dir="{STATE}").health().inflight)\''
    )
    box.wait(
        lambda: box.sh(inflight).stdout.strip() in {"2", "3", "4", "5", "6", "7", "8"},
        what="directives in core's hands",
    )
    box.ok("systemctl stop sensorium.target")
    assert box.states(*UNITS) == ["inactive"] * 3, "the target's stop returned early"
    box.wait(lambda: box.sh("cat /tmp/inv* | grep -c rc=").stdout.strip() == "8", what="ends")
    outputs = box.ok("cat /tmp/inv*")
    assert "outcome-in-doubt" not in outputs, outputs
    for line in outputs.splitlines():
        if line.startswith("sensorium: "):
            # Refused before it ran (stopping, or already gone before it was sent): definite.
            assert "shutting-down" in line or "is not reachable" in line, outputs


def test_kill_9_is_restarted_and_a_wedged_loop_is_restarted_by_the_watchdog(box: Box) -> None:
    box.ok("systemctl start sensorium.target")
    pid = box.main_pid("sensorium-core.service")
    box.ok(f"kill -9 {pid}")
    box.wait(
        lambda: (
            box.main_pid("sensorium-core.service") not in (0, pid)
            and box.states("sensorium-core.service") == ["active"]
        ),
        what="restart after kill -9",
    )
    wedged = box.main_pid("sensorium-poller.service")
    box.ok(f"kill -STOP {wedged}")
    # WatchdogSec=30s: within 2× of it (polls of 0.2 s, bounded by count).
    box.wait(
        lambda: (
            box.main_pid("sensorium-poller.service") not in (0, wedged)
            and box.states("sensorium-poller.service") == ["active"]
        ),
        polls=400,
        what="watchdog restart of a wedged poller",
    )


def test_restart_connector_acts_through_systemctl(box: Box) -> None:
    box.ok("systemctl start sensorium.target")
    before = box.main_pid("sensorium-os.service")
    box.ok("sensorium restart connector")
    box.wait(
        lambda: (
            box.main_pid("sensorium-os.service") not in (0, before)
            and box.states("sensorium-os.service") == ["active"]
        ),
        what="connector restarted",
    )
    assert box.ok("sensorium invoke demo.system.uptime").startswith("completed")


def test_user_units_run_a_node_for_an_ordinary_user(box: Box) -> None:
    box.ok("systemctl stop sensorium.target")
    cli = "/home/op/venv/bin/python -m sensorium.client.cli.main"
    env = "env -u SENSORIUM_STATE_DIR"
    box.ok(f"{env} {cli} install-units --systemd --user", user="op")
    box.ok("systemctl --user daemon-reload && systemctl --user start sensorium.target", user="op")
    assert box.states(*UNITS, user="op") == ["active"] * 3
    out = box.ok(f"{env} {cli} invoke demo.fs.stat --param path=/etc/hostname", user="op")
    assert out.startswith("completed"), out
    box.ok("systemctl --user stop sensorium.target", user="op")
    assert box.states(*UNITS, user="op") == ["inactive"] * 3
