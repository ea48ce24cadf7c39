"""A blocking DEALER client for scripts and the CLI: one call at a time, same guarantees."""

from __future__ import annotations

import time
from typing import TypeVar

import msgspec
import zmq
from zmq.utils.monitor import parse_monitor_message

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.client import REFUSED, unwrap
from sensorium.shared.rpc.curve import ClientKeys
from sensorium.shared.rpc.sockets import DEFAULT_HWM, DEFAULT_MAX_MESSAGE, configure_client, purge
from sensorium.shared.wire.envelope import Reply

T = TypeVar("T")
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_encoder = msgspec.msgpack.Encoder()
# Plain ints: IntFlag arithmetic costs microseconds on every call.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


class SyncRpcClient:
    """Blocking twin of ``RpcClient``. Not thread-safe: one per thread."""

    def __init__(
        self,
        endpoint: str,
        *,
        name: str,
        unavailable_code: str = RuntimeErrorCode.CORE_UNAVAILABLE,
        connect_timeout_s: float = 2.0,
        ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
        max_message: int = DEFAULT_MAX_MESSAGE,
        curve: ClientKeys | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.name = name
        self._unavailable = unavailable_code
        self._connect_timeout_s = connect_timeout_s
        self._ctx = ctx or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        # call() waits for a completed connection before it sends (_await_connection),
        # so the socket need not drop a stopping core's last reply (sockets.py).
        configure_client(self._sock, hwm=DEFAULT_HWM, max_message=max_message, immediate=False)
        events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
        if curve is not None:
            curve.apply(self._sock)
            events |= zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        self.refused = False
        self._monitor = self._sock.get_monitor_socket(events)
        self._sock.connect(endpoint)
        self.connected = False
        # One poller for the socket's life: every call waits on the same two sockets.
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)

    def __repr__(self) -> str:
        return f"<SyncRpcClient {self.name} {self.endpoint} connected={self.connected}>"

    def _drain_monitor(self, timeout_ms: int) -> bool:
        """Apply pending connection events; True when a disconnect was among them."""
        lost = False
        if timeout_ms == 0 and not int(self._monitor.get(_EVENTS)) & _POLLIN:
            return False  # the usual case, without building a poller
        while self._monitor.poll(timeout_ms):
            event = parse_monitor_message(self._monitor.recv_multipart())["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
                self.refused = False
            elif event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                self.refused = True
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected = False
                lost = True
            timeout_ms = 0
        return lost

    def _await_connection(self) -> None:
        deadline = time.monotonic() + self._connect_timeout_s
        self._drain_monitor(0)
        while not self.connected:
            left = deadline - time.monotonic()
            if left <= 0:
                why = REFUSED if self.refused else "is it running? (`sensorium status`)"
                raise CodedError(
                    self._unavailable,
                    f"{self.name} is not reachable at {self.endpoint}; {why}",
                    retry_after_ms=500,
                )
            self._drain_monitor(int(left * 1000) + 1)

    def call(self, request: msgspec.Struct, result_type: type[T], timeout_s: float) -> T:
        self._await_connection()
        rid: str = request.request_id  # type: ignore[attr-defined]
        try:
            self._sock.send(_encoder.encode(request), flags=zmq.NOBLOCK)
        except zmq.Again:
            raise CodedError(
                self._unavailable,
                f"{self.name} is not reachable at {self.endpoint}",
                retry_after_ms=500,
            ) from None
        deadline = time.monotonic() + timeout_s
        poller = self._poller
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CodedError(
                    RuntimeErrorCode.REPLY_TIMEOUT,
                    f"no reply from {self.name} within {timeout_s:.1f}s",
                    retry_after_ms=1000,
                )
            events = dict(poller.poll(int(left * 1000) + 1))
            # Read the socket before the monitor: a reply that arrived just before a
            # disconnect is still this call's answer.
            if self._sock in events and (reply := self._take(rid)) is not None:
                return unwrap(reply, result_type)
            if self._monitor in events and self._drain_monitor(0):
                # The peer's last replies are queued before libzmq reports it gone.
                reply = self._take(rid)
                if reply is not None:
                    return unwrap(reply, result_type)
                self._purge()
                raise CodedError(
                    self._unavailable,
                    f"{self.name} went away while the request was in flight; "
                    "retry with the same idempotency/key",
                    retry_after_ms=500,
                )

    def _purge(self) -> None:
        """Drop what was sent into the gap before the disconnect was seen: a restarted
        peer must not run a call whose caller was told it may not have."""
        purge(self._sock, self.endpoint)

    def _take(self, rid: str) -> Reply | None:
        """This call's reply if it is queued; others are late, dropped."""
        while True:
            try:
                data = self._sock.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return None
            try:
                reply = _reply_decoder.decode(data)
            except (msgspec.DecodeError, ValueError, RecursionError):
                continue
            if reply.request_id == rid:
                return reply

    def close(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
        self._sock.close(linger=0)

    def __enter__(self) -> SyncRpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
