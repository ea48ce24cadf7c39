"""The receiving side of sd_notify: one datagram socket, senders known by their pid.

Like systemd, the supervisor asks the kernel who sent each datagram
(``SCM_CREDENTIALS``), so a message is credited to the process that really sent it.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

_UCRED = struct.Struct("iII")


@dataclass(frozen=True)
class Notification:
    pid: int
    fields: dict[str, str]


class NotifySocket:
    def __init__(self, name: str) -> None:
        self.address = "@" + name
        self.sock = socket.socket(
            socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
        )
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind("\0" + name)

    def __repr__(self) -> str:
        return f"<NotifySocket {self.address}>"

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> list[Notification]:
        """Every datagram waiting now."""
        out: list[Notification] = []
        while True:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
            except (BlockingIOError, InterruptedError):
                return out
            pid = 0
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack(payload[: _UCRED.size])[0]
            fields: dict[str, str] = {}
            for line in data.decode("utf-8", "replace").splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    fields[key] = value
            if pid:
                out.append(Notification(pid, fields))

    def close(self) -> None:
        self.sock.close()


# What a Sensorium process needs from its parent's environment; nothing else is passed on,
# so no secret of the shell that ran `sensorium up` is readable in /proc/<pid>/environ.
_PASSED = (
    "PATH",
    "HOME",
    "LANG",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "PYTHONHOME",
    "XDG_STATE_HOME",
    "SENSORIUM_LOG_LEVEL",
    "SENSORIUM_STATE_DIR",
)


def env_for_child(address: str, watchdog_s: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _PASSED or k.startswith("LC_")}
    env["NOTIFY_SOCKET"] = address
    env["WATCHDOG_USEC"] = str(int(watchdog_s * 1_000_000))
    return env
