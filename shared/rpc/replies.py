"""How a server's answers leave: bounded in size, never waiting on one caller, and
kept for a held peer that is restarting (``held.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog
import zmq

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.logs import LibraryLogger
from sensorium.shared.rpc.channel import Channel
from sensorium.shared.rpc.held import HeldReplies
from sensorium.shared.wire.envelope import Reply, WireError

log = LibraryLogger("sensorium.rpc")


class Replies:
    """One server's outgoing side; ``channel`` is set while its socket is bound."""

    def __init__(self, server: str, max_message: int, held: HeldReplies | None) -> None:
        self.server = server
        self.max_message = max_message
        self.held = held
        self.channel: Channel | None = None
        self.encoder = msgspec.msgpack.Encoder()

    def __repr__(self) -> str:
        return f"<Replies {self.server} held={len(self.held) if self.held else 0}>"

    async def answer(
        self,
        route: list[bytes],
        request: Any,
        handler: Callable[[Any], Awaitable[msgspec.Struct]] | None,
    ) -> None:
        """Run ``handler`` on ``request`` and answer what it returns or raises: a
        ``CodedError`` as its code, anything else as ``internal`` (the traceback goes to
        the log, not on the wire)."""
        rid: str = request.request_id
        with structlog.contextvars.bound_contextvars(**{"request/id": rid}):
            if handler is None:
                self.error(
                    route,
                    rid,
                    CodedError(
                        RuntimeErrorCode.REQUEST_MALFORMED,
                        f"{self.server} does not serve {type(request).__name__}",
                    ),
                )
                return
            try:
                result = await handler(request)
            except CodedError as exc:
                self.error(route, rid, exc)
                return
            except asyncio.CancelledError:
                self.error(
                    route,
                    rid,
                    CodedError(
                        RuntimeErrorCode.SHUTTING_DOWN,
                        f"{self.server} stopped before answering",
                        retry_after_ms=1000,
                        # The handler had begun: whatever it does may have happened.
                        detail={"in_flight": "true"},
                    ),
                )
                raise
            except Exception:
                log.exception(
                    "rpc.handler.crashed", server=self.server, method=type(request).__name__
                )
                self.error(
                    route,
                    rid,
                    CodedError(
                        RuntimeErrorCode.INTERNAL,
                        f"{self.server} failed internally; see logs/{self.server}.jsonl "
                        f"for request/id {rid}",
                    ),
                )
                return
            self.result(route, rid, result)

    def result(self, route: list[bytes], rid: str, result: msgspec.Struct) -> None:
        body = msgspec.Raw(self.encoder.encode(result))
        self.send(route, Reply(request_id=rid, ok=True, result=body))

    def error(self, route: list[bytes], rid: str, exc: CodedError) -> None:
        err = WireError(
            code=exc.code,
            message=exc.message,
            path=exc.path,
            retry_after_ms=exc.retry_after_ms,
            detail=exc.detail,
        )
        self.send(route, Reply(request_id=rid, ok=False, error=err))

    def raw(self, route: list[bytes], data: bytes) -> None:
        """Bytes as they are (a probe's answer); dropped if they cannot leave now."""
        if self.channel is not None:
            try:
                self.channel.send_multipart([*route, data])
            except zmq.ZMQError:
                pass

    def send(self, route: list[bytes], reply: Reply) -> None:
        assert self.channel is not None
        data = self.encoder.encode(reply)
        if len(data) > self.max_message:
            log.error(
                "rpc.reply.too_large",
                server=self.server,
                bytes=len(data),
                **{"request/id": reply.request_id},
            )
            data = self.encoder.encode(
                Reply(
                    request_id=reply.request_id,
                    ok=False,
                    error=WireError(
                        code=RuntimeErrorCode.INTERNAL,
                        message=f"the reply was {len(data)} bytes, over the "
                        f"{self.max_message}-byte limit; see the server's log",
                    ),
                )
            )
        try:
            # Never wait on one caller's full queue: a peer that does not read its
            # replies would otherwise pin handler slots that every other caller needs.
            self.channel.send_multipart([*route, data])
        except zmq.ZMQError as exc:
            if self.held is not None and route == [self.held.peer]:
                self.held.hold(data, reply.request_id)
                return
            # EHOSTUNREACH: the caller went away; EAGAIN: it stopped reading. Either
            # way its reply has nobody to reach.
            log.info(
                "rpc.reply.undeliverable",
                server=self.server,
                reason=exc.strerror,
                **{"request/id": reply.request_id},
            )
