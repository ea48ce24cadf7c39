"""Requests from a connection whose routing id another live connection holds.

``identities.py`` says when a request is suspect (its id is held by another open
connection). Such a connection is judged once: if the holder turns out to be
closing (a quick reconnect), what waited is served; else it is all refused with
``routing-id-in-use``. Up to ``JUDGE_QUEUE`` of its requests wait, counted in flight;
the rest are answered ``overloaded`` at once, so a flood from one connection holds
neither tasks nor frames beyond that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.identities import RoutingIds, printable

JUDGE_QUEUE = 16
# A request held while its connection is judged: frames, CURVE key, arrival (ns).
_Waiting = tuple[list[bytes], str | None, int]
# Serve a request (frames, CURVE key, arrival ns) / refuse one with a coded error. Both
# are called from the server's receive callback, and must not block.
Accept = Callable[[list[bytes], str | None, int], None]
Refuse = Callable[[list[bytes], CodedError], None]


class Judgements:
    def __init__(self, ids: RoutingIds, server: str, accept: Accept, refuse: Refuse) -> None:
        self._ids = ids
        self._server = server
        self._accept = accept
        self._refuse = refuse
        self._tasks: set[asyncio.Task[None]] = set()
        self._suspects: dict[int, list[_Waiting]] = {}
        self.waiting = 0  # requests held in ``_suspects``: in flight too

    @property
    def judging(self) -> int:
        """Connections being judged (one judgement each)."""
        return len(self._tasks)

    def pending(self, fd: int) -> bool:
        """Is this connection under judgement? Then whatever it sends waits, in order."""
        return fd in self._suspects

    def suspect(
        self,
        frames: list[bytes],
        fd: int,
        peer: str | None,
        arrived: int,
        inflight: tuple[int, int],
    ) -> None:
        """Hold a request of a suspected connection (``inflight``: the server's requests
        in flight now, and its limit)."""
        waiting = self._suspects.get(fd)
        full = waiting is not None and len(waiting) >= JUDGE_QUEUE
        if full or inflight[0] >= inflight[1]:
            why = (
                f"{self._server} is still judging whether this connection may use routing "
                f"id {printable(frames[0])} (another live connection holds it)"
                if full
                else f"{self._server} has {inflight[0]} requests in flight"
            )
            self._refuse(
                frames,
                CodedError(RuntimeErrorCode.OVERLOADED, f"{why}; retry later", retry_after_ms=1000),
            )
            return
        if waiting is None:
            waiting = self._suspects[fd] = []
            task = asyncio.create_task(self._judge(frames[0], fd))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        waiting.append((frames, peer, arrived))
        self.waiting += 1

    def refuse_duplicate(self, frames: list[bytes]) -> None:
        self._refuse(
            frames,
            CodedError(
                RuntimeErrorCode.ROUTING_ID_IN_USE,
                f"another live connection to {self._server} uses routing id "
                f"{printable(frames[0])}; this connection is refused while it stays open. "
                "Leave ZMQ_ROUTING_ID unset, or give each socket its own, and reconnect",
            ),
        )

    async def _judge(self, ident: bytes, fd: int) -> None:
        try:
            admitted = await self._ids.settle(ident, fd)
        finally:
            waiting = self._suspects.pop(fd, [])
            self.waiting -= len(waiting)
        for frames, peer, arrived in waiting:
            if admitted:
                self._accept(frames, peer, arrived)
            else:
                self.refuse_duplicate(frames)

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
