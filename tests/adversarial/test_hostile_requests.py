"""Requests built to break the front door: nesting, size, colliding ids, other socket types.
Each must get a coded answer, and the node must go on serving."""

from __future__ import annotations

import asyncio
import threading

import msgspec
import pytest
import zmq
from harness import Stack

from sensorium.client import ParametersInvalid
from sensorium.client.endpoint import core_endpoint
from sensorium.shared.ids import new_id
from sensorium.shared.wire.envelope import Reply

_enc = msgspec.msgpack.Encoder()


def _raw_call(
    stack: Stack,
    payload: bytes,
    *,
    socket_type: int = zmq.DEALER,
    frames: list[bytes] | None = None,
    timeout_ms: int = 5000,
) -> list[bytes]:
    ctx = zmq.Context.instance()
    sock = ctx.socket(socket_type)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, -1)
    if socket_type == zmq.REQ:
        sock.setsockopt(zmq.REQ_RELAXED, 1)
        sock.setsockopt(zmq.REQ_CORRELATE, 1)
    sock.connect(core_endpoint(state_dir=str(stack.paths.root)))
    try:
        sock.send_multipart([*(frames or []), payload])
        assert sock.poll(timeout_ms), "no reply"
        return sock.recv_multipart()
    finally:
        sock.close()


def _invoke_payload(parameters: object, rid: str | None = None) -> bytes:
    return _enc.encode(
        {
            "request/id": rid or new_id(),
            "method": "sensorium.directive.invoke",
            # Contract-valid but for what each test breaks, so a refusal is for that.
            "directive": {
                "schema": "sensorium-directive.v1",
                "schema/v": 1,
                "directive/id": new_id(),
                "directive/issued_at": "2026-01-01T00:00:00Z",
                "issuer": {"module_id": "test.hostile"},
                "action_id": "test.echo-args",
                "parameters": parameters,
                "timing": {"mode": "sync", "timeout_ms": 10000},
            },
        }
    )


def _still_serving(stack: Stack) -> None:
    with stack.client() as c:
        assert c.invoke("demo.system.uptime").status == "completed"


def test_deeply_nested_parameters_are_refused_and_core_keeps_serving(stack: Stack) -> None:
    # 5000 maps deep, written by hand: no encoder will produce it.
    nested = msgspec.Raw(b"\x81\xa1a" * 5000 + b"\xa1x")
    reply = msgspec.msgpack.decode(
        _raw_call(stack, _invoke_payload({"value": nested}))[-1], type=Reply
    )
    assert not reply.ok and reply.error is not None
    assert reply.error.code == "request-malformed"
    _still_serving(stack)


def test_an_oversized_request_gets_request_too_large(stack: Stack) -> None:
    payload = _invoke_payload({"value": "x" * (5 * 1024 * 1024)})
    reply = msgspec.msgpack.decode(_raw_call(stack, payload)[-1], type=Reply)
    assert reply.error is not None and reply.error.code == "request-too-large"
    _still_serving(stack)


def test_a_huge_invalid_parameter_is_not_echoed_back(stack: Stack) -> None:
    with stack.client() as c, pytest.raises(ParametersInvalid) as err:
        c.invoke("demo.fs.stat", {"path": "relative" + "x" * 2_000_000})
    assert len(err.value.message) < 2000
    _still_serving(stack)


def test_a_req_socket_with_correlate_gets_its_reply(stack: Stack) -> None:
    frames = _raw_call(
        stack, _enc.encode({"request/id": "r1", "method": "health"}), socket_type=zmq.REQ
    )
    reply = msgspec.msgpack.decode(frames[-1], type=Reply)
    assert reply.ok and reply.request_id == "r1"


def test_two_callers_with_the_same_request_id_each_get_their_own_outcome(stack: Stack) -> None:
    rid = new_id()
    results: dict[str, object] = {}

    def call(name: str, value: str) -> None:
        frames = _raw_call(stack, _invoke_payload({"value": value}, rid), timeout_ms=20000)
        results[name] = msgspec.msgpack.decode(frames[-1], type=Reply)

    threads = [threading.Thread(target=call, args=(n, n)) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for name in ("first", "second"):
        reply = results[name]
        assert isinstance(reply, Reply) and reply.ok, reply
        # A sensorium-directive-result.v1 carrying the execution report.
        outcome = msgspec.msgpack.decode(reply.result)["sensorium/outcome"]
        assert outcome["stdout"]["text"].strip() == f'["--", "{name}"]'


def test_binary_output_at_the_caps_still_fits_one_reply(stack: Stack) -> None:
    with stack.client() as c:
        out = c.invoke("test.binary", {"bytes": 1048576})
        assert out.status == "completed"
        assert out.stdout.truncated and out.stderr.truncated
        assert out.stdout.bytes_total == 1048576
    _still_serving(stack)


def test_spawns_past_the_limit_are_refused_at_once_not_queued(state_dir: object) -> None:
    from harness import TEST_ACTIONS, start_stack

    from sensorium.client import AsyncClient, Overloaded

    s = start_stack(
        state_dir,
        TEST_ACTIONS,  # type: ignore[arg-type]
        node={"limits": {"connector_max_concurrent_spawns": 2}},
    )
    try:
        s.wait_ready()

        async def main() -> None:
            async with AsyncClient(state_dir=str(s.paths.root)) as c:
                slow = [
                    asyncio.create_task(c.invoke("test.sleep", {"seconds": 3})) for _ in range(2)
                ]
                await asyncio.to_thread(s.action_pids, "sleep.py", 2, 60)
                with pytest.raises(Overloaded):
                    await c.invoke("test.sleep", {"seconds": 0})
                # Refused while both spawn slots are still taken, not queued behind them.
                assert not any(task.done() for task in slow)
                for task in slow:
                    assert (await task).status == "completed"

        asyncio.run(main())
    finally:
        s.stop()
