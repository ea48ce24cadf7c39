"""How much open-loop load ``sensorium replay`` itself can offer: it must never be the
bottleneck (the issue asks for at least 5,000 requests/s).

Measured: ``replay_synthetic`` (the engine behind ``sensorium replay --synthetic``)
against a server that costs next to nothing — a bare pyzmq ROUTER in a separate
process (``multiprocessing``, spawn) that decodes each request's head with msgspec and
answers a ``Reply`` with ``ok: true`` — at offered rates of 5,000/s and 10,000/s for
``SECONDS`` each, then at 50,000/s to find the tool's ceiling. For each: the rate the
tool actually sent at, its own send lag p99 (how late it sent against the plan), and
the replies it matched.

Peer: the plan itself — the offered rate, which a tool that is never the bottleneck
sends exactly (ratio 1.0). The tool is single-threaded; the echo server has the other
core on a 2-core machine.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.synchronize
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import zmq
from _harness import emit, machine, parse_args, row

from sensorium.client.replay import replay_synthetic
from sensorium.shared.wire.envelope import Reply, RequestHead

BENCH = "replay load tool"
SECONDS = 5.0
RATES = (5_000, 10_000)
CEILING_RATE = 50_000
CEILING_SECONDS = 3.0


def echo_server(
    endpoint: str, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event
) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.SNDHWM, 1_000_000)
    sock.setsockopt(zmq.RCVHWM, 1_000_000)
    sock.bind(endpoint)
    head = msgspec.msgpack.Decoder(RequestHead)
    enc = msgspec.msgpack.Encoder()
    ready.set()
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while not stop.is_set():
        if not poller.poll(100):
            continue
        while True:
            try:
                ident, payload = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            rid = head.decode(payload).request_id or ""
            sock.send_multipart([ident, enc.encode(Reply(request_id=rid, ok=True))])
    sock.close(linger=0)
    ctx.term()


def run() -> dict[str, Any]:
    m = machine()
    mpctx = mp.get_context("spawn")
    ready, stop = mpctx.Event(), mpctx.Event()
    with tempfile.TemporaryDirectory(prefix="sb-replay-") as tmp:
        endpoint = f"ipc://{Path(tmp) / 'echo.sock'}"
        server = mpctx.Process(target=echo_server, args=(endpoint, ready, stop), daemon=True)
        server.start()
        try:
            if not ready.wait(15):
                raise RuntimeError("echo server did not start")
            runs = []
            for rate, seconds in [(r, SECONDS) for r in RATES] + [(CEILING_RATE, CEILING_SECONDS)]:
                report = replay_synthetic(
                    "bench.echo", rate=rate, duration_s=seconds, endpoint=endpoint, concurrency=4
                )
                runs.append((rate, report))
        finally:
            stop.set()
            server.join(5)
            if server.is_alive():
                server.kill()
    rows = []
    notes = []
    for rate, r in runs:
        lag = r.send_lag_ms.p99 if r.send_lag_ms else None
        rows.append(
            row(
                BENCH,
                f"sent/s at offered {rate:,}/s",
                r.sent_rps,
                float(rate),
                unit="req/s",
                peer_name="the plan (offered rate)",
                higher_is_better=True,
            )
        )
        notes.append(
            f"replay at offered {rate:,}/s: sent {r.sent} ({r.sent_rps:,.0f}/s), answered "
            f"{r.answered} ({r.throughput_rps:,.0f}/s), send lag p99 {lag} ms, latency p99 "
            f"{r.latency_ms.p99 if r.latency_ms else None} ms, errors {r.errors}"
        )
    return {"name": "replay_capacity", "machine": m, "rows": rows, "notes": notes}


def main() -> None:
    args = parse_args(__doc__)
    emit(run(), args.json)


if __name__ == "__main__":
    main()
