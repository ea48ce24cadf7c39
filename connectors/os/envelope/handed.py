"""Helper material handed to an action as opaque process setup: the scoped signer grant.

Core names a grant by a token in the dispatch; the connector connects to core's signer
socket and gives the action that connection as an inherited fd, with the fd's number
and the token in its environment. It never reads or writes the connection, never
interprets a domain and never signs: what passes over it is between the action's
helper (``sensorium-sign``) and core.
"""

from __future__ import annotations

import socket

from sensorium.shared.paths import StatePaths
from sensorium.shared.signer.protocol import ENV_FD, ENV_TOKEN, SOCKET_NAME

# The action finds the channel at the first fd after stdio and the sealed script.
FIRST_HANDED_FD = 3


def open_signer_channel(paths: StatePaths) -> int:
    """A blocking stream connection to core's signer (its fd, now the caller's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(str(paths.run / SOCKET_NAME))
    except OSError:
        sock.close()
        raise
    return sock.detach()


def signer_env(fd_number: int, token: str) -> dict[str, str]:
    return {ENV_FD: str(fd_number), ENV_TOKEN: token}
