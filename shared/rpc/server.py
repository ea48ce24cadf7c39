"""An asyncio ROUTER server: decode once, dispatch to a handler task, always reply."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
import structlog
import zmq
import zmq.asyncio

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.logs import LibraryLogger
from sensorium.shared.rpc.sockets import DEFAULT_HWM, DEFAULT_MAX_MESSAGE, configure, prepare_ipc
from sensorium.shared.wire.envelope import Reply, RequestHead, WireError

Handler = Callable[[Any], Awaitable[msgspec.Struct]]
# Bounds on replies held for a restarting peer (see ``hold_for``).
HOLD_MAX_REPLIES = 1024
HOLD_MAX_BYTES = 64 * 1024 * 1024
log = LibraryLogger("sensorium.rpc")


class RpcServer:
    """Serves one tagged request union on one ROUTER socket.

    A request that does not decode gets a ``request-malformed`` reply; a handler
    that raises ``CodedError`` gets that code; anything else is ``internal`` (with
    the traceback in the log, not on the wire). Past ``max_inflight`` requests, new
    ones get ``overloaded`` at once.
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        request_type: Any,
        handlers: Mapping[type, Handler],
        *,
        name: str,
        max_inflight: int = 1024,
        hwm: int = DEFAULT_HWM,
        max_message: int = DEFAULT_MAX_MESSAGE,
        hold_for: bytes | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.name = name
        self._ctx = ctx
        self._decoder = msgspec.msgpack.Decoder(request_type)
        self._head_decoder = msgspec.msgpack.Decoder(RequestHead)
        self._encoder = msgspec.msgpack.Encoder()
        self._handlers = dict(handlers)
        self._max_inflight = max_inflight
        self._hwm = hwm
        self._max_message = max_message
        self._sock: zmq.asyncio.Socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.crash: BaseException | None = None
        # Replies the peer named ``hold_for`` missed (it restarted while they were being
        # produced) wait for its return instead of vanishing: the late replies its new
        # incarnation reconciles. Bounded in count and bytes.
        self._hold_for = hold_for
        self._held: collections.deque[bytes] = collections.deque()
        self._held_bytes = 0
        self.held_dropped = 0

    def __repr__(self) -> str:
        return (
            f"<RpcServer {self.name} {self.endpoint} inflight={len(self._tasks)}"
            f"/{self._max_inflight} closing={self._closing}>"
        )

    @property
    def inflight(self) -> int:
        return len(self._tasks)

    def bind(self) -> None:
        prepare_ipc(self.endpoint)
        sock = self._ctx.socket(zmq.ROUTER)
        # The socket's hard limit sits above the accepted size, so an oversized request
        # gets a coded `request-too-large` reply instead of a dropped connection.
        configure(sock, hwm=self._hwm, max_message=2 * self._max_message)
        # A reply to a vanished peer raises instead of vanishing silently.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if self._hold_for is not None:
            # The held-for peer's new connection takes over its identity at once.
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.bind(self.endpoint)
        self._sock = sock

    def start(self, on_crash: Callable[[], None]) -> asyncio.Task[None]:
        """Serve in a task; if the receive loop itself ever dies, say so and call
        ``on_crash`` (the process then stops and its supervisor restarts it) rather than
        leaving a live process that answers nobody."""
        task = asyncio.create_task(self.serve(), name=f"rpc-serve-{self.name}")

        def done(t: asyncio.Task[None]) -> None:
            if t.cancelled() or t.exception() is None:
                return
            self.crash = t.exception()
            log.error("rpc.server.crashed", server=self.name, error=repr(self.crash))
            on_crash()

        task.add_done_callback(done)
        return task

    async def serve(self) -> None:
        """Receive until cancelled. Each request runs in its own task."""
        assert self._sock is not None, "bind() first"
        sock = self._sock
        while True:
            frames = await sock.recv_multipart(copy=True)
            # DEALER peers send [payload]; REQ peers add an envelope ending in an empty
            # delimiter (with REQ_CORRELATE, a request-id frame before it): echo it back.
            ident, envelope, payload = frames[0], frames[1:-1], frames[-1]
            if len(frames) < 2 or (envelope and envelope[-1] != b""):
                log.warning("rpc.frame.dropped", server=self.name, frames=len(frames))
                continue
            route = [ident, *envelope]
            if self._held and ident == self._hold_for:
                await self._redeliver(ident)
            rid = self._peek_id(payload)
            refusal = self._refuse(payload)
            if refusal is not None:
                await self._reply_error(route, rid, refusal)
                continue
            try:
                request = self._decoder.decode(payload)
            except Exception as exc:  # DecodeError, and RecursionError for deep nesting
                reason = str(exc) if isinstance(exc, msgspec.DecodeError) else "nested too deeply"
                await self._reply_error(
                    route,
                    rid,
                    CodedError(
                        RuntimeErrorCode.REQUEST_MALFORMED, f"request does not decode: {reason}"
                    ),
                )
                continue
            task = asyncio.create_task(self._handle(route, request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _refuse(self, payload: bytes) -> CodedError | None:
        """Whatever is refused before decoding: shutdown, size, overload."""
        if self._closing:
            return CodedError(
                RuntimeErrorCode.SHUTTING_DOWN,
                f"{self.name} is shutting down; retry shortly",
                retry_after_ms=1000,
            )
        if len(payload) > self._max_message:
            return CodedError(
                RuntimeErrorCode.REQUEST_TOO_LARGE,
                f"request is {len(payload)} bytes; {self.name} accepts at most {self._max_message}",
            )
        if len(self._tasks) >= self._max_inflight:
            return CodedError(
                RuntimeErrorCode.OVERLOADED,
                f"{self.name} has {len(self._tasks)} requests in flight; retry later",
                retry_after_ms=200,
            )
        return None

    def _peek_id(self, payload: bytes) -> str:
        try:
            head = self._head_decoder.decode(payload)
        except Exception:
            return ""
        rid = head.request_id if isinstance(head.request_id, str) else ""
        return rid[:64]

    async def _handle(self, route: list[bytes], request: Any) -> None:
        handler = self._handlers.get(type(request))
        rid: str = request.request_id
        with structlog.contextvars.bound_contextvars(**{"request/id": rid}):
            if handler is None:
                await self._reply_error(
                    route,
                    rid,
                    CodedError(
                        RuntimeErrorCode.REQUEST_MALFORMED,
                        f"{self.name} does not serve {type(request).__name__}",
                    ),
                )
                return
            try:
                result = await handler(request)
            except CodedError as exc:
                await self._reply_error(route, rid, exc)
                return
            except asyncio.CancelledError:
                await self._reply_error(
                    route,
                    rid,
                    CodedError(
                        RuntimeErrorCode.SHUTTING_DOWN,
                        f"{self.name} stopped before answering",
                        retry_after_ms=1000,
                    ),
                )
                raise
            except Exception:
                log.exception(
                    "rpc.handler.crashed", server=self.name, method=type(request).__name__
                )
                await self._reply_error(
                    route,
                    rid,
                    CodedError(
                        RuntimeErrorCode.INTERNAL,
                        f"{self.name} failed internally; see logs/{self.name}.jsonl "
                        f"for request/id {rid}",
                    ),
                )
                return
            body = msgspec.Raw(self._encoder.encode(result))
            await self._send(route, Reply(request_id=rid, ok=True, result=body))

    async def _reply_error(self, route: list[bytes], rid: str, exc: CodedError) -> None:
        err = WireError(
            code=exc.code,
            message=exc.message,
            path=exc.path,
            retry_after_ms=exc.retry_after_ms,
            detail=exc.detail,
        )
        await self._send(route, Reply(request_id=rid, ok=False, error=err))

    async def _send(self, route: list[bytes], reply: Reply) -> None:
        assert self._sock is not None
        data = self._encoder.encode(reply)
        if len(data) > self._max_message:
            log.error(
                "rpc.reply.too_large",
                server=self.name,
                bytes=len(data),
                **{"request/id": reply.request_id},
            )
            data = self._encoder.encode(
                Reply(
                    request_id=reply.request_id,
                    ok=False,
                    error=WireError(
                        code=RuntimeErrorCode.INTERNAL,
                        message=f"the reply was {len(data)} bytes, over the "
                        f"{self._max_message}-byte limit; see the server's log",
                    ),
                )
            )
        try:
            await self._sock.send_multipart([*route, data])
        except zmq.ZMQError as exc:
            if route == [self._hold_for]:
                self._hold(data, reply.request_id)
                return
            # EHOSTUNREACH: the caller went away; its reply has nobody to reach.
            log.info(
                "rpc.reply.undeliverable",
                server=self.name,
                reason=exc.strerror,
                **{"request/id": reply.request_id},
            )

    def _hold(self, data: bytes, rid: str) -> None:
        if len(self._held) >= HOLD_MAX_REPLIES or self._held_bytes + len(data) > HOLD_MAX_BYTES:
            self.held_dropped += 1
            log.error(
                "rpc.reply.hold_full",
                server=self.name,
                held=len(self._held),
                dropped=self.held_dropped,
                **{"request/id": rid},
            )
            return
        self._held.append(data)
        self._held_bytes += len(data)
        log.info("rpc.reply.held", server=self.name, held=len(self._held), **{"request/id": rid})

    async def _redeliver(self, ident: bytes) -> None:
        """The held-for peer is back: hand it what it missed, oldest first."""
        assert self._sock is not None
        sent = 0
        while self._held:
            data = self._held[0]
            try:
                await self._sock.send_multipart([ident, data])
            except zmq.ZMQError:
                break  # gone again; keep the rest for its next return
            self._held.popleft()
            self._held_bytes -= len(data)
            sent += 1
        log.info("rpc.reply.redelivered", server=self.name, replies=sent, held=len(self._held))

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting, let in-flight handlers finish up to ``timeout_s``, cancel the rest."""
        self._closing = True
        pending = list(self._tasks)
        if pending:
            _done, still = await asyncio.wait(pending, timeout=timeout_s)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=1.0)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
