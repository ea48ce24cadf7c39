"""sd_notify over a real datagram socket, credited to the sender's pid by the kernel."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading

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


def test_a_manager_that_stops_reading_never_freezes_the_sender() -> None:
    """A full queue (the manager reads nothing) drops pings at once and bounds the wait
    of READY=1 and STOPPING=1: a blocking send would freeze the sender's event loop,
    and with it every request it serves."""
    sock = NotifySocket(f"t-{new_id()}")
    sent: list[bool] = []
    try:
        n = Notifier({"NOTIFY_SOCKET": sock.address})

        def flood() -> None:
            sent.extend(n.watchdog() for _ in range(200))
            sent.append(n.stopping())

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        sender.join(60)  # blocked forever before
        assert not sender.is_alive(), "a send blocked on the full queue"
        assert sent[:5] == [True] * 5 and not all(sent)  # the queue filled; the rest dropped
        assert sent[-1] is False  # STOPPING=1 waited its bound, then gave up
        # Once the manager reads again, sends go through again.
        sock.receive()
        assert n.watchdog()
    finally:
        sock.close()
