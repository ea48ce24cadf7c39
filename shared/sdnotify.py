"""The sd_notify protocol: ``READY=1``, ``WATCHDOG=1``, ``STATUS=``, ``STOPPING=1``.

The same code talks to systemd (``Type=notify``) and to Sensorium's supervisor,
which provides ``NOTIFY_SOCKET`` itself.
"""

from __future__ import annotations

import os
import socket
import time

NOTIFY_ENV = "NOTIFY_SOCKET"
# How long READY=1 and STOPPING=1 wait for room in a manager's full queue. A watchdog
# ping or a STATUS= line is dropped at once instead (the next one follows).
STATE_WAIT_S = 2.0
STATE_WAIT_STEP_S = 0.01


def _address(raw: str) -> str:
    # A leading '@' names the abstract namespace.
    return "\0" + raw[1:] if raw.startswith("@") else raw


class Notifier:
    """Sends datagrams to ``$NOTIFY_SOCKET``; a no-op when it is unset."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self._addr = env.get(NOTIFY_ENV)
        self._sock: socket.socket | None = None
        if self._addr:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        self.watchdog_s: float | None = None
        if usec and usec.isdigit() and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1_000_000

    def __repr__(self) -> str:
        return f"<Notifier socket={self._addr!r} watchdog_s={self.watchdog_s}>"

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *fields: str, wait_s: float = 0.0) -> bool:
        """Whether the manager got the datagram. Never blocks past ``wait_s``: a manager
        that stops reading fills its queue (``net.unix.max_dgram_qlen``, 10 by default),
        and a blocking send would then freeze this process's event loop, and with it
        every request it serves."""
        if self._sock is None or not self._addr:
            return False
        data = "\n".join(fields).encode()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._sock.sendto(data, socket.MSG_DONTWAIT, _address(self._addr))
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(STATE_WAIT_STEP_S)
                continue
            except OSError:
                return False
            return True

    def ready(self, status: str = "") -> bool:
        fields = ("READY=1", *([f"STATUS={status}"] if status else []))
        return self.send(*fields, wait_s=STATE_WAIT_S)

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1", wait_s=STATE_WAIT_S)
