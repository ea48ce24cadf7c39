"""One relayed flow's accounting: a TCP connection or a UDP flow, one transcript row."""

from __future__ import annotations

from sensorium.shared.wire.declaration import Endpoint


class Conn:
    """Bytes each way, when it began and ended, and why it ended early ("" if it did not).

    ``sent`` and ``received`` are payload bytes (the transcript's); ``charged`` is what the
    byte caps count: the same for TCP, plus a UDP header's 8 bytes per datagram for UDP.
    """

    def __init__(self, endpoint: Endpoint, started: float) -> None:
        self.endpoint = endpoint
        self.started = started
        self.ended: float | None = None
        self.sent = 0
        self.received = 0
        self.charged = 0
        self.note = ""

    def __repr__(self) -> str:
        e = self.endpoint
        return (
            f"<Conn {e.protocol} {e.host}:{e.port} sent={self.sent} "
            f"received={self.received} charged={self.charged} note={self.note!r}>"
        )
