"""The bare peer for round trips: a pyzmq DEALER→ROUTER echo that answers like core.

The server runs in a spawned process and does per request what any server of this
protocol must: decode the request as a client-API Struct (msgspec, the same tagged
union core decodes) and encode a ``Reply``. The reply is a template taken from core
itself (raw bytes of one real answer) with only ``request/id`` replaced, so both sides
move the same bytes through the same transport and codec. The client builds and
encodes the request Struct as ``Client`` does and decodes the reply (and its result,
when a result type is given). What the echo leaves out is exactly what is measured:
core's admission, connector, storage, logging and the Client's connection monitoring.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.synchronize
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec
import zmq

from sensorium.shared.wire.client_api import ClientRequest
from sensorium.shared.wire.envelope import Reply

READY_TIMEOUT_S = 15.0


def echo_server(
    endpoint: str, template: bytes, ready: mp.synchronize.Event, stop: mp.synchronize.Event
) -> None:
    """ROUTER: decode each request, answer with the template reply under its request id."""
    decoder = msgspec.msgpack.Decoder(ClientRequest)
    encoder = msgspec.msgpack.Encoder()
    reply = msgspec.msgpack.decode(template, type=Reply)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    ready.set()
    try:
        while not stop.is_set():
            if not sock.poll(100):
                continue
            ident, payload = sock.recv_multipart()
            req = decoder.decode(payload)
            answer = msgspec.structs.replace(reply, request_id=req.request_id)
            sock.send_multipart([ident, encoder.encode(answer)])
    finally:
        sock.close(linger=0)
        ctx.term()


def core_reply(endpoint: str, request: msgspec.Struct, timeout_ms: int = 5000) -> tuple[int, bytes]:
    """One request to core by a raw DEALER (not timed): request size and core's raw reply."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    try:
        sock.connect(endpoint)
        payload = msgspec.msgpack.encode(request)
        sock.send(payload)
        return len(payload), sock.recv()
    finally:
        sock.close(linger=0)


class Echo:
    """The echo server process and a DEALER connected to it; stops both on exit."""

    def __init__(self, template: bytes) -> None:
        self.template = template
        self._dir = Path(tempfile.mkdtemp(prefix="sb-echo-", dir="/tmp"))
        self.endpoint = f"ipc://{self._dir}/echo.sock"
        mpctx = mp.get_context("spawn")
        self._ready, self._stop = mpctx.Event(), mpctx.Event()
        self._server = mpctx.Process(
            target=echo_server, args=(self.endpoint, template, self._ready, self._stop), daemon=True
        )
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Reply)

    def __enter__(self) -> Echo:
        try:
            self._server.start()
            if not self._ready.wait(READY_TIMEOUT_S):
                raise RuntimeError(f"echo server did not bind within {READY_TIMEOUT_S:.0f} s")
            self._sock.connect(self.endpoint)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def roundtrip(self, request: msgspec.Struct, result_type: type[Any] | None = None) -> int:
        """One timed round trip (ns): encode, send, receive, decode (the result too)."""
        t0 = time.perf_counter_ns()
        self._sock.send(self._encoder.encode(request))
        reply = self._decoder.decode(self._sock.recv())
        if result_type is not None:
            msgspec.msgpack.decode(reply.result, type=result_type)
        elapsed = time.perf_counter_ns() - t0
        if reply.request_id != getattr(request, "request_id", None):
            raise AssertionError("echo answered another request")
        return elapsed

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
        self._stop.set()
        if self._server.pid is not None:
            self._server.join(5)
            if self._server.is_alive():
                self._server.terminate()
                self._server.join(5)
            if self._server.is_alive():
                self._server.kill()
                self._server.join()
        shutil.rmtree(self._dir, ignore_errors=True)
