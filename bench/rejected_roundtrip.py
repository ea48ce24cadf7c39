"""Admission round trip of a refused directive through sensorium-core, against a bare echo.

Measured: ``Client.invoke("bench.nope", {})`` with the blocking ``Client`` — core decodes
the ``Invoke``, admission finds no such action, core replies ``action-not-allowlisted``,
then audits and logs the refusal (``Directives.refused_at_once`` in core/directives.py);
the client raises ``ActionNotAllowlisted``. This is core's admission decision alone:
the connector is not involved. Time is taken around the whole call
(``perf_counter_ns``). (An *accepted* admission, which also has the connector persist a
job and core register it, is measured against the same echo in deferred_peer.py.)

Peer: the bare pyzmq DEALER→ROUTER echo of ``_echo.py`` over ipc, its server in a
separate process, answering with core's own rejection reply (raw bytes of a real one,
its ``request/id`` replaced): the same bytes through the same transport and codec,
without core's admission, audit, logging or the Client's connection monitoring.

Both run in the same process, interleaved in blocks after a warm-up; the default is
2000 measured iterations each.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from _echo import Echo, core_reply
from _harness import emit, machine, parse_args, row, runtime, summary_us

from sensorium.client import ActionNotAllowlisted, Client
from sensorium.client.api import make_directive
from sensorium.shared.ids import new_id
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.directive import Issuer
from sensorium.shared.wire.envelope import Reply
from sensorium.shared.wire.result import DirectiveResult

ISSUER = Issuer(module_id="sensorium-bench")
BENCH = "admission round-trip, refused"
PEER = "pyzmq DEALER→ROUTER msgspec echo"
ACTION = "bench.nope"
WARMUP = 200
ITERATIONS = 2000
BLOCKS = 4


def _invoke_request() -> Invoke:
    directive = make_directive(
        ACTION, {}, issuer=ISSUER, timeout_ms=None, idempotency_key=None, correlation_id=None
    )
    return Invoke(request_id=new_id(), directive=directive)


def core_once(client: Client) -> int:
    t0 = time.perf_counter_ns()
    try:
        client.invoke(ACTION, {})
    except ActionNotAllowlisted:
        return time.perf_counter_ns() - t0
    raise AssertionError(f"{ACTION} was not rejected")


def client_once(client: Client) -> int:
    """The same call against the echo: what the ``Client`` itself adds to the bare round
    trip. The timeouts are given, so that it never asks the echo for the catalog."""
    t0 = time.perf_counter_ns()
    try:
        client.invoke(ACTION, {}, timeout_ms=1000, reply_timeout_s=5.0)
    except ActionNotAllowlisted:
        return time.perf_counter_ns() - t0
    raise AssertionError("the echo's reply was not a rejection")


def run(iterations: int = ITERATIONS) -> dict[str, Any]:
    m = machine()  # first, so the load average is not our own
    core: list[int] = []
    echo: list[int] = []
    own: list[int] = []
    with runtime(bench_true=False) as rt, Client(state_dir=str(rt.state_dir)) as client:
        req_bytes, template = core_reply(client.endpoint, _invoke_request())
        decoded = msgspec.msgpack.decode(template, type=Reply)
        assert decoded.result is not None, decoded
        refused = msgspec.msgpack.decode(decoded.result, type=DirectiveResult)
        assert refused.status == "rejected", refused
        with Echo(template) as peer, Client(peer.endpoint) as to_echo:
            for _ in range(WARMUP):
                core_once(client)
                peer.roundtrip(_invoke_request())
                client_once(to_echo)
            per_block = iterations // BLOCKS
            for _ in range(BLOCKS):
                core.extend(core_once(client) for _ in range(per_block))
                echo.extend(peer.roundtrip(_invoke_request()) for _ in range(per_block))
                own.extend(client_once(to_echo) for _ in range(per_block))
    c, e, o = summary_us(core), summary_us(echo), summary_us(own)
    return {
        "name": "rejected_roundtrip",
        "machine": m,
        "core": c,
        "echo": e,
        "client_to_echo": o,
        "bytes": {"request": req_bytes, "reply": len(template)},
        "rows": [
            row(
                BENCH,
                "median (unknown action)",
                c["median_us"],
                e["median_us"],
                unit="µs",
                peer_name=PEER,
            ),
            row(BENCH, "p99 (unknown action)", c["p99_us"], e["p99_us"], unit="µs", peer_name=PEER),
            row(
                BENCH,
                "median, the Client against the echo (no core)",
                o["median_us"],
                e["median_us"],
                unit="µs",
                peer_name=PEER,
            ),
        ],
        "notes": [
            f"admission round-trip, refused: {len(core)} iterations each after {WARMUP} "
            f"warm-up, interleaved in {BLOCKS} blocks; blocking Client vs bare DEALER (server "
            f"in a spawned process) answering with core's own reply; request/reply "
            f"{req_bytes}/{len(template)} bytes on both",
            f"admission round-trip, refused, where the time goes: the Client against the "
            f"same echo takes {o['median_us']:,.0f} µs, so the Client adds "
            f"{o['median_us'] - e['median_us']:,.0f} µs to the bare round trip and core "
            f"{c['median_us'] - o['median_us']:,.0f} µs (medians of the interleaved blocks)",
        ],
    }


def main() -> None:
    args = parse_args(
        __doc__, lambda p: p.add_argument("--iterations", type=int, default=ITERATIONS)
    )
    emit(run(args.iterations), args.json)


if __name__ == "__main__":
    main()
