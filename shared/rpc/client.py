"""An asyncio DEALER client: many calls in flight on one socket, matched by ``request/id``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.logs import LibraryLogger
from sensorium.shared.rpc.channel import Channel, blocking_socket, monitor_of
from sensorium.shared.rpc.curve import ClientKeys
from sensorium.shared.rpc.sockets import DEFAULT_HWM, DEFAULT_MAX_MESSAGE, configure_client, purge
from sensorium.shared.wire.envelope import Reply, WireError

T = TypeVar("T")
log = LibraryLogger("sensorium.rpc")

_reply_decoder = msgspec.msgpack.Decoder(Reply)
# One decoder per result type, built on first use (a handful of types per process).
_result_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}
# How long a call waits for a connection before it says "unreachable" (a client made
# a moment ago is still handshaking; a restarting server is back within this).
CONNECT_WAIT_S = 1.0
_encoder = msgspec.msgpack.Encoder()
REFUSED = (
    "it refused this client's CURVE handshake (its key is not allowlisted there, "
    "or the server key is wrong)"
)


def new_request_id() -> str:
    return new_id()


def unwrap(reply: Reply, result_type: type[T]) -> T:
    """The typed result of a reply, or the ``CodedError`` it carries."""
    if not reply.ok:
        err = reply.error
        if err is None:
            raise CodedError(RuntimeErrorCode.INTERNAL, "reply carries neither result nor error")
        raise CodedError(
            err.code,
            err.message,
            path=err.path,
            retry_after_ms=err.retry_after_ms,
            detail=dict(err.detail),
        )
    try:
        decoder = _result_decoders.get(result_type)
        if decoder is None:
            decoder = _result_decoders[result_type] = msgspec.msgpack.Decoder(result_type)
        result: T = decoder.decode(reply.result)
        return result
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:
        raise CodedError(
            RuntimeErrorCode.REPLY_MALFORMED,
            f"the reply's result is not a {getattr(result_type, '__name__', result_type)}: "
            f"{exc!s:.300}",
        ) from None


class RpcClient:
    """Calls one server. A peer that disconnects fails every call in flight at once
    with ``unavailable_code``; a call that outlives its timeout gets ``reply-timeout``
    and its late reply, should it come, is dropped.
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        *,
        name: str,
        unavailable_code: str = RuntimeErrorCode.CORE_UNAVAILABLE,
        on_connect: Callable[[], Awaitable[None]] | None = None,
        on_unmatched: Callable[[Reply], None] | None = None,
        routing_id: bytes | None = None,
        hwm: int = DEFAULT_HWM,
        max_message: int = DEFAULT_MAX_MESSAGE,
        curve: ClientKeys | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.name = name
        self._unavailable = unavailable_code
        self._on_connect = on_connect
        self._on_unmatched = on_unmatched
        # Driven by a Channel (channel.py), not pyzmq's asyncio layer: a Future per
        # message cost more than the rest of a call's path through this client.
        self._sock: zmq.Socket[bytes] = blocking_socket(ctx, zmq.DEALER)
        # Without IMMEDIATE a disconnect keeps the replies already received: call()
        # waits for a completed connection itself, and a disconnect drains what is
        # queued and purges what was not sent (_on_disconnect).
        configure_client(self._sock, hwm=hwm, max_message=max_message, immediate=False)
        if routing_id is not None:
            # A stable identity lets the server hold replies for this caller's restart.
            self._sock.setsockopt(zmq.ROUTING_ID, routing_id)
        events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
        if curve is not None:
            curve.apply(self._sock)
            # A refused handshake is worth naming: the call would only say "unreachable".
            events |= zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        self.refused = False
        self._monitor = Channel(monitor_of(self._sock, events))
        self._channel = Channel(self._sock)
        self._sock.connect(endpoint)
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._up = asyncio.Event()  # set while a connection is completed
        self._closed = False
        self._tasks = [
            asyncio.create_task(self._pump(), name=f"rpc-pump-{name}"),
            asyncio.create_task(self._watch(), name=f"rpc-watch-{name}"),
        ]

    @property
    def connected(self) -> bool:
        return self._up.is_set()

    def __repr__(self) -> str:
        return (
            f"<RpcClient {self.name} {self.endpoint} connected={self.connected} "
            f"pending={len(self._pending)}>"
        )

    async def call(self, request: msgspec.Struct, result_type: type[T], timeout_s: float) -> T:
        """Send ``request`` (which carries its ``request/id``) and await its typed result."""
        if self._closed:
            raise CodedError(self._unavailable, f"the client for {self.name} is closed")
        rid: str = request.request_id  # type: ignore[attr-defined]
        if rid in self._pending:
            # Two calls under one id could only ever be told apart by luck.
            raise CodedError(
                RuntimeErrorCode.REQUEST_MALFORMED,
                f"request/id {rid} is already in flight on this connection; use a fresh id",
            )
        if not self.connected:
            await self._await_connection()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Reply] = loop.create_future()
        self._pending[rid] = fut
        # A timer on the reply's own future, not asyncio.wait_for (a second future and
        # a loop turn more per call).
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            try:
                self._channel.send(_encoder.encode(request))
            except zmq.Again:
                why = REFUSED if self.refused else "is it running?"
                raise CodedError(
                    self._unavailable,
                    f"{self.name} is not reachable at {self.endpoint}; {why}",
                    retry_after_ms=500,
                ) from None
            try:
                reply = await fut
            except TimeoutError:
                raise CodedError(
                    RuntimeErrorCode.REPLY_TIMEOUT,
                    f"no reply from {self.name} within {timeout_s:.1f}s",
                    retry_after_ms=1000,
                ) from None
        finally:
            timer.cancel()
            self._pending.pop(rid, None)
        return unwrap(reply, result_type)

    async def _await_connection(self) -> None:
        """What IMMEDIATE does for a socket that keeps it off: no peer, no send."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._up.wait(), CONNECT_WAIT_S)
        if self.connected:
            return
        why = REFUSED if self.refused else "is it running?"
        raise CodedError(
            self._unavailable,
            f"{self.name} is not reachable at {self.endpoint}; {why}",
            retry_after_ms=500,
        )

    async def _pump(self) -> None:
        # Each reply is delivered from the loop's reader callback: its caller's task
        # resumes in the next turn, with no Future or task step of the pump's between.
        with contextlib.suppress(zmq.ZMQError):  # closed
            await self._channel.pump(self._take)

    def _take(self, raw: list[zmq.Frame]) -> None:
        # A server answers with one frame; more are each delivered (and dropped if they
        # are no reply), as separate receives would have.
        for frame in raw:
            self._deliver(frame.bytes)

    def _deliver(self, payload: bytes) -> None:
        try:
            reply = _reply_decoder.decode(payload)
        except (msgspec.DecodeError, ValueError, RecursionError) as exc:
            log.warning("rpc.reply.malformed", client=self.name, error=str(exc))
            return
        fut = self._pending.get(reply.request_id)
        if fut is None or fut.done():
            log.info("rpc.reply.unmatched", client=self.name, **{"request/id": reply.request_id})
            if self._on_unmatched is not None:
                try:
                    self._on_unmatched(reply)
                except Exception:
                    log.exception("rpc.on_unmatched.failed", client=self.name)
            return
        fut.set_result(reply)

    async def _watch(self) -> None:
        while True:
            try:
                msg = parse_monitor_message(await self._monitor.recv_parts())
            except zmq.ZMQError:
                return
            event = msg["event"]
            if event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                if not self.refused:
                    log.warning("rpc.peer.refused", client=self.name, endpoint=self.endpoint)
                self.refused = True
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._up.set()
                self.refused = False
                log.info("rpc.peer.connected", client=self.name, endpoint=self.endpoint)
                if self._on_connect is not None:
                    task = asyncio.create_task(self._run_on_connect())
                    self._tasks.append(task)
                    task.add_done_callback(self._forget)
            elif event == zmq.EVENT_DISCONNECTED:
                self._on_disconnect()

    def _on_disconnect(self) -> None:
        """The peer is gone. Its last replies are already queued here (libzmq reads a
        connection to its end before it reports the disconnect): deliver them, fail
        what is still waiting, and drop requests sent into the gap so that a restarted
        peer never runs a call whose caller was told it may not have. (A handshake
        that failed ends in a disconnect too; nothing was sent on it.)"""
        was_connected = self.connected
        self._up.clear()
        while True:
            try:
                payload = self._sock.recv(flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            self._deliver(payload)
        if was_connected:
            purge(self._sock, self.endpoint)
        self._channel.recheck()  # the reads and the reconnect above used the socket itself
        # Every reply that came is delivered by now (the pump delivers what it takes
        # in the same step): what is still pending had no answer.
        asyncio.get_running_loop().call_soon(
            self._fail_pending,
            f"{self.name} went away while the request was in flight",
            set(self._pending),
        )

    def _forget(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    async def _run_on_connect(self) -> None:
        assert self._on_connect is not None
        try:
            await self._on_connect()
        except Exception:
            log.exception("rpc.on_connect.failed", client=self.name)

    def _fail_pending(self, why: str, only: set[str] | None = None) -> None:
        failed = [
            (rid, fut)
            for rid, fut in list(self._pending.items())
            if not fut.done() and (only is None or rid in only)
        ]
        if failed:
            log.warning(
                "rpc.peer.lost",
                client=self.name,
                inflight=len(failed),
                request_ids=[rid for rid, _ in failed[:20]],
            )
        for rid, fut in failed:
            fut.set_result(Reply(request_id=rid, ok=False, error=_lost(self._unavailable, why)))

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fail_pending(f"client for {self.name} closed")
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._monitor.close()
        self._channel.close()


def _expire(fut: asyncio.Future[Reply]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def _lost(code: str, why: str) -> WireError:
    return WireError(
        code=code,
        message=f"{why}; retry with the same idempotency/key",
        retry_after_ms=500,
        detail={"in_flight": "true"},
    )
