"""The open-loop engine against a real ROUTER that answers late, or with failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import zmq

from sensorium.client.replay.engine import Engine
from sensorium.client.replay.plan import Planned, synthetic
from sensorium.shared.wire.envelope import Reply, RequestHead


def _server(endpoint: str, delay_s: float, stop: threading.Event) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    head = msgspec.msgpack.Decoder(RequestHead)
    enc = msgspec.msgpack.Encoder()
    waiting: list[tuple[float, bytes, str]] = []
    while not stop.is_set():
        if sock.poll(10):
            ident, payload = sock.recv_multipart()
            waiting.append(
                (time.monotonic() + delay_s, ident, head.decode(payload).request_id or "")
            )
        for item in [w for w in waiting if w[0] <= time.monotonic()]:
            waiting.remove(item)
            sock.send_multipart([item[1], enc.encode(Reply(request_id=item[2], ok=True))])
    sock.close(linger=0)
    ctx.term()


def _run(tmp_path: Path, delay_s: float, plan: Iterator[Planned], timeout_s: float) -> Engine:
    endpoint = f"ipc://{tmp_path / 'slow.sock'}"
    stop = threading.Event()
    server = threading.Thread(target=_server, args=(endpoint, delay_s, stop))
    server.start()
    try:
        engine = Engine(endpoint, concurrency=2, reply_timeout_s=timeout_s)
        engine.run(plan)
        return engine
    finally:
        stop.set()
        server.join(5)


def test_a_reply_later_than_the_timeout_counts_as_reply_timeout_not_answered(
    tmp_path: Path,
) -> None:
    plan = synthetic("x.y", {}, rate=10, duration_s=0.2)  # two requests, 0.1 s apart
    started = time.monotonic()
    engine = _run(tmp_path, 0.6, plan, timeout_s=0.3)
    t = engine.tally
    assert (t.sent, t.answered, t.ok) == (2, 0, 0)
    assert t.errors == {"reply-timeout": 2}
    # It gave up at the timeout rather than sleeping on until something else happened.
    assert time.monotonic() - started < 5


def test_latency_runs_from_when_a_request_was_due(tmp_path: Path) -> None:
    engine = _run(tmp_path, 0.05, synthetic("x.y", {}, rate=50, duration_s=0.2), timeout_s=5)
    t = engine.tally
    assert (t.sent, t.answered, t.ok) == (10, 10, 10) and not t.errors
    assert t.latency.get_min_value() >= 50_000  # µs: the server's delay at least
