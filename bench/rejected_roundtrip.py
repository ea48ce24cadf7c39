"""Round-trip latency of a rejected directive through sensorium-core, against a bare echo.

Measured: ``Client.invoke("bench.nope", {})`` with the blocking ``Client`` — core decodes
the ``Invoke``, finds no such action, audits the rejection (whether the reply waits for
that SQLite write is core's choice: see ``_record_rejection`` in core/service.py), logs it
and replies ``action-not-allowlisted``; the client raises ``ActionNotAllowlisted``. Time is
taken around the whole call (``perf_counter_ns``).

Peer: a bare pyzmq DEALER→ROUTER echo over ipc with its server in a separate process
(``multiprocessing``, spawn). Per request the peer client builds and encodes the same
``Invoke`` Struct the Client sends, the server decodes it with msgspec and encodes a
``Reply``/``WireError`` of the same shape and text as core's rejection, and the client
decodes that. So the peer is "the same bytes through the same transport and codec",
without core's admission, audit, logging or the Client's connection monitoring.

Both run in the same process, interleaved in blocks after a warm-up; the default is
2000 measured iterations each.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.synchronize
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq
from _harness import emit, machine, parse_args, row, runtime, summary_us

from sensorium.client import ActionNotAllowlisted, Client
from sensorium.client.api import make_directive
from sensorium.shared.ids import new_id
from sensorium.shared.wire.client_api import ClientRequest, Invoke
from sensorium.shared.wire.envelope import Reply, WireError

BENCH = "rejected round-trip"
PEER = "pyzmq DEALER→ROUTER msgspec echo"
ACTION = "bench.nope"
WARMUP = 200
ITERATIONS = 2000
BLOCKS = 4
REJECTION_TEXT = (
    f"{ACTION!r} is not an action of this node's catalog; `sensorium actions` lists the ones it has"
)


def echo_server(endpoint: str, ready: mp.synchronize.Event, stop: mp.synchronize.Event) -> None:
    """ROUTER: decode each request as a client-API Struct, answer with a coded error."""
    decoder = msgspec.msgpack.Decoder(ClientRequest)
    encoder = msgspec.msgpack.Encoder()
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
            reply = Reply(
                request_id=req.request_id,
                ok=False,
                error=WireError(
                    code="action-not-allowlisted", message=REJECTION_TEXT, path="$.action_id"
                ),
            )
            sock.send_multipart([ident, encoder.encode(reply)])
    finally:
        sock.close(linger=0)
        ctx.term()


def _invoke_request() -> Invoke:
    directive = make_directive(
        ACTION, {}, timeout_ms=None, idempotency_key=None, correlation_id=None
    )
    return Invoke(request_id=new_id(), directive=directive)


def core_once(client: Client) -> int:
    t0 = time.perf_counter_ns()
    try:
        client.invoke(ACTION, {})
    except ActionNotAllowlisted:
        return time.perf_counter_ns() - t0
    raise AssertionError(f"{ACTION} was not rejected")


def echo_once(
    sock: zmq.Socket[bytes],
    encoder: msgspec.msgpack.Encoder,
    decoder: msgspec.msgpack.Decoder[Reply],
) -> int:
    t0 = time.perf_counter_ns()
    sock.send(encoder.encode(_invoke_request()))
    reply = decoder.decode(sock.recv())
    elapsed = time.perf_counter_ns() - t0
    assert not reply.ok and reply.error is not None
    return elapsed


def raw_core_sizes(endpoint: str) -> tuple[int, int]:
    """Bytes of one rejected Invoke and of core's reply, by a raw DEALER (not timed)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        sock.connect(endpoint)
        payload = msgspec.msgpack.encode(_invoke_request())
        sock.send(payload)
        reply = sock.recv()
        decoded = msgspec.msgpack.decode(reply, type=Reply)
        assert decoded.error is not None and decoded.error.code == "action-not-allowlisted", decoded
        return len(payload), len(reply)
    finally:
        sock.close(linger=0)


def run(iterations: int = ITERATIONS) -> dict[str, Any]:
    m = machine()  # first, so the load average is not our own
    mpctx = mp.get_context("spawn")
    ready, stop = mpctx.Event(), mpctx.Event()
    echo_dir = Path(tempfile.mkdtemp(prefix="sb-echo-", dir="/tmp"))
    endpoint = f"ipc://{echo_dir}/echo.sock"
    server = mpctx.Process(target=echo_server, args=(endpoint, ready, stop), daemon=True)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(Reply)
    core: list[int] = []
    echo: list[int] = []
    try:
        server.start()
        if not ready.wait(15):
            raise RuntimeError("echo server did not bind within 15 s")
        sock.connect(endpoint)
        with runtime(bench_true=False) as rt, Client(state_dir=str(rt.state_dir)) as client:
            req_bytes, reply_bytes = raw_core_sizes(client.endpoint)
            echo_req = len(encoder.encode(_invoke_request()))
            echo_reply = len(
                encoder.encode(
                    Reply(
                        request_id=new_id(),
                        ok=False,
                        error=WireError(
                            code="action-not-allowlisted",
                            message=REJECTION_TEXT,
                            path="$.action_id",
                        ),
                    )
                )
            )
            for _ in range(WARMUP):
                core_once(client)
                echo_once(sock, encoder, decoder)
            per_block = iterations // BLOCKS
            for _ in range(BLOCKS):
                core.extend(core_once(client) for _ in range(per_block))
                echo.extend(echo_once(sock, encoder, decoder) for _ in range(per_block))
    finally:
        sock.close(linger=0)
        ctx.term()
        stop.set()
        server.join(5)
        if server.is_alive():
            server.terminate()
            server.join(5)
        if server.is_alive():
            server.kill()
            server.join()
        shutil.rmtree(echo_dir, ignore_errors=True)
    c, e = summary_us(core), summary_us(echo)
    return {
        "name": "rejected_roundtrip",
        "machine": m,
        "core": c,
        "echo": e,
        "bytes": {
            "core_request": req_bytes,
            "core_reply": reply_bytes,
            "echo_request": echo_req,
            "echo_reply": echo_reply,
        },
        "rows": [
            row(BENCH, "median", c["median_us"], e["median_us"], unit="µs", peer_name=PEER),
            row(BENCH, "p99", c["p99_us"], e["p99_us"], unit="µs", peer_name=PEER),
        ],
        "notes": [
            f"rejected round-trip: {len(core)} iterations each after {WARMUP} warm-up, "
            f"interleaved in {BLOCKS} blocks; blocking Client vs bare DEALER "
            f"(server in a spawned process); request/reply bytes core "
            f"{req_bytes}/{reply_bytes}, echo {echo_req}/{echo_reply}",
        ],
    }


def main() -> None:
    args = parse_args(__doc__)
    emit(run(), args.json)


if __name__ == "__main__":
    main()
