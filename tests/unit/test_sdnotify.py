"""sd_notify over a real datagram socket, credited to the sender's pid by the kernel."""

from __future__ import annotations

import os
import select
import subprocess
import sys

from sensorium.shared.ids import new_id
from sensorium.shared.sdnotify import Notifier
from sensorium.supervisor.notify import NotifySocket


def _wait(sock: NotifySocket) -> None:
    select.select([sock.fileno()], [], [], 2.0)


def test_ready_status_and_watchdog_reach_the_supervisor_with_the_sender_pid() -> None:
    sock = NotifySocket(f"t-{new_id()}")
    try:
        n = Notifier({"NOTIFY_SOCKET": sock.address, "WATCHDOG_USEC": "2000000"})
        assert n.watchdog_s == 2.0
        assert n.ready("serving")
        assert n.watchdog()
        _wait(sock)
        notes = sock.receive()
        assert [x.pid for x in notes] == [os.getpid(), os.getpid()]
        assert notes[0].fields == {"READY": "1", "STATUS": "serving"}
        assert notes[1].fields == {"WATCHDOG": "1"}
    finally:
        sock.close()


def test_a_child_process_is_credited_with_its_own_pid() -> None:
    sock = NotifySocket(f"t-{new_id()}")
    try:
        code = "from sensorium.shared.sdnotify import Notifier; Notifier().ready()"
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "NOTIFY_SOCKET": sock.address},
            check=True,
        )
        assert proc.returncode == 0
        _wait(sock)
        notes = sock.receive()
        assert len(notes) == 1 and notes[0].pid != os.getpid()
    finally:
        sock.close()


def test_without_notify_socket_nothing_is_sent_and_nothing_fails() -> None:
    n = Notifier({})
    assert not n.enabled and not n.ready() and n.watchdog_s is None


def test_watchdog_for_another_pid_is_ignored() -> None:
    n = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"})
    assert n.watchdog_s is None
