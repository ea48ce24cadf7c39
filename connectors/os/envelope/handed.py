"""Helper material handed to an action as opaque process setup: the scoped signer grant.

Core names a grant by a token in the dispatch; the connector connects to core's signer
socket, binds the connection to that grant with one line (so core closes it when the
grant ends, whether or not the action ever used it) and gives the action that
connection as an inherited fd, with the fd's number and the token in its environment.
Past that line it never reads or writes the connection, never interprets a domain and
never signs: what passes over it is between the action's helper (``sensorium-sign``)
and core.
"""

from __future__ import annotations

import json
import socket

from sensorium.shared.paths import StatePaths
from sensorium.shared.signer.protocol import BIND, ENV_FD, ENV_TOKEN, SOCKET_NAME

# The action finds the channel at the first fd after stdio and the sealed script.
FIRST_HANDED_FD = 3


def open_signer_channel(paths: StatePaths, token: str) -> int:
    """A blocking stream connection to core's signer, bound to the grant of ``token``
    (its fd, now the caller's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(str(paths.run / SOCKET_NAME))
        sock.sendall(json.dumps({BIND: token}).encode() + b"\n")
    except OSError:
        sock.close()
        raise
    return sock.detach()


def signer_env(fd_number: int, token: str) -> dict[str, str]:
    return {ENV_FD: str(fd_number), ENV_TOKEN: token}
