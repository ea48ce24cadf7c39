"""An asyncio ROUTER server: decode once, dispatch to a handler task, always reply."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import msgspec
import zmq
import zmq.asyncio

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.logs import LibraryLogger
from sensorium.shared.rpc.channel import Channel, blocking_socket
from sensorium.shared.rpc.curve import CurveServer, ZapHandler
from sensorium.shared.rpc.decode import LiberalDecoder, Undecodable, request_id_of
from sensorium.shared.rpc.framing import source_fd, split_frames, user_id
from sensorium.shared.rpc.held import HeldReplies
from sensorium.shared.rpc.identities import RoutingIds, Verdict
from sensorium.shared.rpc.judging import Judgements
from sensorium.shared.rpc.probe import PROBE, ProbeReply, self_probe
from sensorium.shared.rpc.replies import Replies
from sensorium.shared.rpc.sockets import DEFAULT_HWM, DEFAULT_MAX_MESSAGE, configure, prepare_ipc

Handler = Callable[[Any], Awaitable[msgspec.Struct]]


class AnswerThen(NamedTuple):
    """An answer decided at once, and what is done right after it was sent: work its
    caller need not wait for (a refusal's record and log line), still in the same turn
    of the loop, before the next request is read."""

    answer: msgspec.Struct
    then: Callable[[], None]


# A request's answer decided at once in the receive loop, without a task: the reply's
# result (with what follows it), or None for the request to go to its handler as usual.
AtOnce = Callable[[Any], msgspec.Struct | AnswerThen | None]
# Called with the peer's CURVE key (Z85; None without CURVE) and the decoded request
# before dispatch; raising ``CodedError`` refuses the request with that code.
Authorize = Callable[[str | None, Any], None]
# The CURVE key (Z85) of the connection the request being handled came on; None
# without CURVE (ipc). Set for each request's handler task, so handlers can scope
# what they answer to the caller.
PEER: contextvars.ContextVar[str | None] = contextvars.ContextVar("rpc_peer", default=None)
# The bytes of the request being handled, as they arrived: what a signature over the
# request's document is checked against (core/authenticity.py), since a decoded Struct
# drops the fields it does not know.
PAYLOAD: contextvars.ContextVar[bytes | None] = contextvars.ContextVar("rpc_payload", default=None)
# How long a drained server's last replies may take to leave at close.
DRAIN_FLUSH_MS = 1000
# How long nothing must arrive, after a drain, before the receive loop stops.
QUIESCE_S = 0.25
# How often connection events are applied while no request arrives (memory bound only:
# every request applies them before it is judged).
IDS_DRAIN_S = 1.0
log = LibraryLogger("sensorium.rpc")
# The servers bound in this process: what its watchdog ping vouches for.
_bound: weakref.WeakSet[RpcServer] = weakref.WeakSet()


def bound_servers() -> list[RpcServer]:
    """Every RpcServer bound (and not yet closed) in this process."""
    return list(_bound)


class RpcServer:
    """Serves one tagged request union on one ROUTER socket.

    A request that does not decode gets a ``request-malformed`` reply; a handler
    that raises ``CodedError`` gets that code; anything else is ``internal`` (with
    the traceback in the log, not on the wire). Past ``max_inflight`` requests (those
    handled, and those waiting on a routing-id judgement), new ones get ``overloaded``
    at once.

    With ``curve`` (tcp endpoints) the socket is a CURVE server whose ZAP handler
    refuses unknown keys during the handshake; ``authorize`` then vets each request
    with the peer's key before it is dispatched.

    ``at_once`` maps a request type to a function that may answer it in the receive
    loop (a decision that needs no I/O, such as an admission refusal): a task and its
    handler run only when it returns None.
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
        curve: CurveServer | None = None,
        authorize: Authorize | None = None,
        on_request: Callable[[bytes, bytes, Any, int], None] | None = None,
        missing_field_codes: dict[str, str] | None = None,
        at_once: Mapping[type, AtOnce] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.name = name
        self._ctx = ctx
        self._decoder = LiberalDecoder(request_type, missing_field_codes)
        self._handlers = dict(handlers)
        self._at_once = dict(at_once or {})
        self._max_inflight = max_inflight
        self._hwm = hwm
        self._max_message = max_message
        self._sock: Channel | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._last_arrival = time.monotonic()
        self.crash: BaseException | None = None
        # Replies the peer named ``hold_for`` missed (it restarted while they were being
        # produced) wait for its return instead of vanishing: the late replies its new
        # incarnation reconciles. Bounded in count and bytes.
        self._held = HeldReplies(hold_for, name) if hold_for is not None else None
        self._replies = Replies(name, max_message, self._held)
        self._curve = curve
        self._authorize = authorize
        self._zap: ZapHandler | None = None
        # Sees each admitted request: the peer's routing id, the bytes, the decoded
        # request and its arrival time (core's recorder).
        self._on_request = on_request
        # Who this server is to a probe: another process on our path cannot answer so.
        self._token = secrets.token_hex(8)
        self._ipc_inode: tuple[int, int] | None = None
        self._serving: asyncio.Task[None] | None = None
        # One live connection per routing id (identities.py). Not on a server that holds
        # replies for one fixed-id peer: there a reconnect must simply take over.
        self._ids: RoutingIds | None = None
        self._judgements: Judgements | None = None

    def __repr__(self) -> str:
        return (
            f"<RpcServer {self.name} {self.endpoint} inflight={self.inflight}"
            f"/{self._max_inflight} judging={self.judging} closing={self._closing}>"
        )

    @property
    def inflight(self) -> int:
        """Requests being handled, and those waiting on a routing-id judgement."""
        return len(self._tasks) + (self._judgements.waiting if self._judgements else 0)

    @property
    def judging(self) -> int:
        """Connections whose routing id is being judged (one judgement each)."""
        return self._judgements.judging if self._judgements else 0

    def bind(self) -> None:
        prepare_ipc(self.endpoint)
        if self._curve is not None:
            # The ZAP handler first: a CURVE handshake with no handler is not checked.
            self._zap = ZapHandler(self._ctx, self._curve, self.name)
            self._zap.bind()
        # A blocking socket driven by a Channel: pyzmq's asyncio layer cost more per
        # request than the rest of a refusal's path together.
        sock: zmq.Socket[bytes] = blocking_socket(self._ctx, zmq.ROUTER)
        # The socket's hard limit sits above the accepted size, so an oversized request
        # gets a coded `request-too-large` reply instead of a dropped connection.
        configure(sock, hwm=self._hwm, max_message=2 * self._max_message)
        # A reply to a vanished peer raises instead of vanishing silently.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A peer with a fixed identity (core on the seam, the poller on core) that
        # reconnects takes its identity over at once, instead of being ignored while
        # its old connection lingers. Generated identities never collide.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if self._curve is not None:
            self._curve.apply(sock)
        if self._held is None:
            self._ids = RoutingIds(sock, self.name)
            self._judgements = Judgements(self._ids, self.name, self._accept, self._refuse_frames)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError:
            if self._ids is not None:
                self._ids.close()
                self._ids = None
                self._judgements = None
            sock.close(linger=0)
            if self._zap is not None:
                self._zap.close()
                self._zap = None
            raise
        self._sock = self._replies.channel = Channel(sock)
        if self.endpoint.startswith("ipc://"):
            st = os.stat(self.endpoint[len("ipc://") :])
            self._ipc_inode = (st.st_dev, st.st_ino)
        _bound.add(self)

    def start(self, on_crash: Callable[[], None]) -> asyncio.Task[None]:
        """Serve in a task; if the receive loop itself ever dies, say so and call
        ``on_crash`` (the process then stops and its supervisor restarts it) rather than
        leaving a live process that answers nobody."""
        task = asyncio.create_task(self.serve(), name=f"rpc-serve-{self.name}")
        self._serving = task

        def done(t: asyncio.Task[None]) -> None:
            if t.cancelled() or t.exception() is None:
                return
            self.crash = t.exception()
            log.error("rpc.server.crashed", server=self.name, error=repr(self.crash))
            on_crash()

        task.add_done_callback(done)
        return task

    async def serve(self) -> None:
        """Receive until cancelled. Each request runs in its own task, unless ``at_once``
        answered it."""
        assert self._sock is not None, "bind() first"
        helpers: list[asyncio.Task[None]] = []
        if self._zap is not None:
            helpers.append(asyncio.create_task(self._zap.serve(), name=f"rpc-zap-{self.name}"))
        if self._ids is not None:
            helpers.append(asyncio.create_task(self._drain_ids(), name=f"rpc-ids-{self.name}"))
        try:
            await self._receive()
        finally:
            for helper in helpers:
                helper.cancel()
            for helper in helpers:
                with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError):
                    await helper

    async def _drain_ids(self) -> None:
        while self._ids is not None:
            self._ids.drain()
            await asyncio.sleep(IDS_DRAIN_S)

    async def _receive(self) -> None:
        assert self._sock is not None
        # Each request is taken and judged in the loop's reader callback (Channel.pump):
        # an answer decided at once leaves in the turn its request woke the loop.
        await self._sock.pump(self._arrive)

    def _arrive(self, raw: list[zmq.Frame]) -> None:
        arrived = time.monotonic_ns()
        self._last_arrival = arrived / 1e9
        frames = [f.bytes for f in raw]
        peer = user_id(raw[-1]) if self._authorize is not None else None
        if self._ids is not None and self._judgements is not None:
            judgements = self._judgements
            fd = source_fd(raw[-1])
            # A connection under judgement waits for it, in order, whatever it sends.
            verdict = Verdict.SUSPECT if judgements.pending(fd) else self._ids.admit(frames[0], fd)
            if verdict is Verdict.REFUSE:
                judgements.refuse_duplicate(frames)
                return
            if verdict is Verdict.SUSPECT:
                judgements.suspect(frames, fd, peer, arrived, (self.inflight, self._max_inflight))
                return
        self._accept(frames, peer, arrived)

    def _accept(self, frames: list[bytes], peer: str | None, arrived: int) -> None:
        """One request from a connection entitled to its routing id: answer it."""
        route, payload, framing = split_frames(frames)
        if framing is not None:
            log.warning("rpc.frame.malformed", server=self.name, frames=len(frames))
            if route:  # answer it, matched by the id the first body frame carries
                self._replies.error(route, self._peek_id(payload), framing)
            return
        ident = route[0]
        if payload.startswith(PROBE):
            self._answer_probe(route)
            return
        if self._held and ident == self._held.peer:
            assert self._sock is not None
            self._held.redeliver(self._sock)
        refusal = self._refuse(payload)
        if refusal is not None:
            self._replies.error(route, self._peek_id(payload), refusal)
            return
        try:
            request = self._decoder.decode(payload)
        except Undecodable as exc:
            self._replies.error(
                route,
                exc.request_id,
                CodedError(exc.code, exc.message, path=exc.path),
            )
            return
        except Exception as exc:  # a decoder bug must not stop the serving
            log.exception("rpc.decode.crashed", server=self.name)
            self._replies.error(
                route,
                self._peek_id(payload),
                CodedError(
                    RuntimeErrorCode.REQUEST_MALFORMED,
                    f"request does not decode: {type(exc).__name__}",
                ),
            )
            return
        if self._authorize is not None and not self._authorized(route, peer, request):
            return
        if self._on_request is not None:
            # Only what is admitted past the grants: a recording must not hold
            # requests the node refused, for a replay would run them.
            try:
                self._on_request(ident, payload, request, arrived)
            except Exception:  # an observer's bug must not stop the serving
                log.exception("rpc.observer.crashed", server=self.name)
        # The task copies this context: its handler sees the key it came with (and so
        # does an answer at once).
        PEER.set(peer)
        PAYLOAD.set(payload)
        quick = self._at_once.get(type(request))
        if quick is not None and self._answered_at_once(route, request, quick):
            return
        handler = self._handlers.get(type(request))
        task = asyncio.create_task(self._replies.answer(route, request, handler))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _answered_at_once(self, route: list[bytes], request: Any, quick: AtOnce) -> bool:
        try:
            answer = quick(request)
        except Exception:  # its bug must not stop the serving: the handler decides
            log.exception("rpc.at_once.crashed", server=self.name, method=type(request).__name__)
            return False
        if answer is None:
            return False
        if not isinstance(answer, AnswerThen):
            self._replies.result(route, request.request_id, answer)
            return True
        self._replies.result(route, request.request_id, answer.answer)
        try:
            answer.then()
        except Exception:  # the answer went; its bug must not stop the serving
            log.exception("rpc.at_once.then.crashed", server=self.name)
        return True

    def _refuse_frames(self, frames: list[bytes], exc: CodedError) -> None:
        """Refuse what arrived, matched by the ``request/id`` its body carries."""
        route, payload, _framing = split_frames(frames)
        self._replies.error(route or frames[:1], self._peek_id(payload), exc)

    def _answer_probe(self, route: list[bytes]) -> None:
        assert self._sock is not None
        body = ProbeReply(
            server=self.name,
            pid=os.getpid(),
            token=self._token,
            inflight=self.inflight,
            closing=self._closing,
        )
        self._replies.raw(route, PROBE + self._replies.encoder.encode(body))

    async def check(self, timeout_s: float) -> str | None:
        """None when this server still serves: its socket is open, its receive loop
        runs, and (ipc) the path clients connect to is still its own socket and a probe
        sent there comes back from it. Otherwise what is wrong, in words."""
        if self._sock is None:
            return f"{self.name}: its socket is closed"
        if self._serving is not None and self._serving.done():
            return f"{self.name}: its receive loop ended"
        if self._ipc_inode is None:
            # tcp: a CURVE handshake would need a client key; the loop and socket must do.
            return None
        return await self_probe(
            self._ctx, self.endpoint, self._ipc_inode, self._token, self.name, timeout_s
        )

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
        if self.inflight >= self._max_inflight:
            return CodedError(
                RuntimeErrorCode.OVERLOADED,
                f"{self.name} has {self.inflight} requests in flight; retry later",
                retry_after_ms=200,
            )
        return None

    def _authorized(self, route: list[bytes], peer: str | None, request: Any) -> bool:
        assert self._authorize is not None
        rid: str = request.request_id
        try:
            self._authorize(peer, request)
        except CodedError as exc:
            log.info(
                "rpc.request.refused",
                server=self.name,
                code=exc.code,
                message=exc.message[:300],
                **{"request/id": rid},
            )
            self._replies.error(route, rid, exc)
            return False
        except Exception:
            log.exception("rpc.authorize.crashed", server=self.name, **{"request/id": rid})
            self._replies.error(
                route, rid, CodedError(RuntimeErrorCode.INTERNAL, f"{self.name} failed internally")
            )
            return False
        return True

    @staticmethod
    def _peek_id(payload: bytes) -> str:
        """The body's ``request/id``, read only on the paths that refuse it."""
        try:
            return request_id_of(msgspec.msgpack.decode(payload))
        except Exception:
            return ""

    async def drain(
        self,
        timeout_s: float,
        *,
        then: Callable[[], Awaitable[None]] | None = None,
        then_s: float = 0.0,
    ) -> None:
        """Stop accepting, let in-flight handlers finish up to ``timeout_s``; then, if
        some still run, ``then()`` (a way to make them end) and up to ``then_s`` more;
        cancel the rest."""
        self._closing = True
        pending = list(self._tasks)
        if pending:
            _done, still = await asyncio.wait(pending, timeout=timeout_s)
            if still and then is not None:
                try:
                    await then()
                except Exception:
                    log.exception("rpc.drain.then_failed", server=self.name)
                _done, still = await asyncio.wait(still, timeout=then_s)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=1.0)

    async def quiesce(self, quiet_s: float = QUIESCE_S, at_most_s: float = 2.0) -> None:
        """After a drain: keep refusing (``shutting-down``) what still arrives until
        nothing has for ``quiet_s``, so a request sent as the drain ended is answered,
        not dropped unread at close (its caller would be left in doubt)."""
        waited = 0.0
        while waited < at_most_s and time.monotonic() - self._last_arrival < quiet_s:
            await asyncio.sleep(0.05)
            waited += 0.05

    def close(self) -> None:
        _bound.discard(self)
        if self._judgements is not None:
            self._judgements.cancel()
        if self._ids is not None:
            self._ids.close()
            self._ids = None
        if self._sock is not None:
            # After a drain, the last replies may still sit in the socket's queue: give
            # them a bounded moment to leave (a stop never hangs on it; linger is capped).
            self._sock.close(linger=DRAIN_FLUSH_MS if self._closing else 0)
            self._sock = self._replies.channel = None
        if self._zap is not None:
            self._zap.close()
            self._zap = None
