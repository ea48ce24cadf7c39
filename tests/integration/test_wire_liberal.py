"""What common MessagePack codecs send is read as they mean it, and every request —
undecodable, oddly framed, JSON — gets exactly one answer that names its request/id
and the failing location (docs/wire-protocol.md, "Encoding rules" and "Framing")."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import msgspec
import pytest
import zmq
from harness import Stack

from sensorium.client.endpoint import core_endpoint
from sensorium.shared.ids import new_id
from sensorium.shared.wire.envelope import Reply

_enc = msgspec.msgpack.Encoder()


def _directive(**overrides: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "schema": "sensorium-directive.v1",
        "schema/v": 1,
        "directive/id": new_id(),
        "directive/issued_at": "2026-01-01T00:00:00Z",
        "issuer": {"module_id": "test.codecs"},
        "action_id": "test.echo-args",
        "parameters": {"value": "x"},
        "timing": {"mode": "sync", "timeout_ms": 10000},
    }
    d.update(overrides)
    return d


def _request(directive: dict[str, Any], rid: str) -> dict[str, Any]:
    return {"request/id": rid, "method": "sensorium.directive.invoke", "directive": directive}


def _call(stack: Stack, frames: list[bytes], socket_type: int = zmq.DEALER) -> list[bytes]:
    sock = zmq.Context.instance().socket(socket_type)
    sock.setsockopt(zmq.LINGER, 0)
    if socket_type == zmq.REQ:
        sock.setsockopt(zmq.REQ_RELAXED, 1)
    sock.connect(core_endpoint(state_dir=str(stack.paths.root)))
    try:
        sock.send_multipart(frames)
        assert sock.poll(20_000), "no reply: every request must be answered"
        return sock.recv_multipart()
    finally:
        sock.close()


def _reply(frames: list[bytes]) -> Reply:
    return msgspec.msgpack.decode(frames[-1], type=Reply)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"timing": {"mode": "sync", "timeout_ms": 10000.0}}, id="integer-float"),
        pytest.param(
            {"directive/issued_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)},
            id="timestamp-extension",
        ),
        pytest.param({"correlation/id": None, "idempotency/key": None}, id="nil-optional"),
    ],
)
def test_what_codecs_send_by_default_is_read_as_meant(stack: Stack, change: dict[str, Any]) -> None:
    rid = new_id()
    reply = _reply(_call(stack, [_enc.encode(_request(_directive(**change), rid))]))
    assert reply.request_id == rid
    assert reply.ok, reply.error


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        pytest.param({"action_id": b"test.echo-args"}, "$.directive.action_id", "bin", id="bin"),
        pytest.param(
            {"timing": {"mode": "sync", "timeout_ms": 10000.5}},
            "$.directive.timing.timeout_ms",
            "int",
            id="fractional",
        ),
        pytest.param(
            {"timing": {"mode": "sync", "timeout_ms": "10000"}},
            "$.directive.timing.timeout_ms",
            "int",
            id="numeric-string",
        ),
    ],
)
def test_what_needs_a_guess_is_refused_with_its_location(
    stack: Stack, change: dict[str, Any], path: str, words: str
) -> None:
    rid = new_id()
    reply = _reply(_call(stack, [_enc.encode(_request(_directive(**change), rid))]))
    assert not reply.ok and reply.error is not None
    assert reply.request_id == rid, "a client with several in flight must know which failed"
    assert reply.error.code == "request-malformed"
    assert reply.error.path == path, reply.error
    assert words in reply.error.message


def test_a_json_body_is_told_the_endpoint_speaks_messagepack(stack: Stack) -> None:
    rid = new_id()
    body = json.dumps(_request(_directive(), rid)).encode()
    reply = _reply(_call(stack, [body]))
    assert not reply.ok and reply.error is not None
    assert reply.request_id == rid
    assert "speaks MessagePack" in reply.error.message and reply.error.path == "$"


@pytest.mark.parametrize(
    ("frames", "socket_type"),
    [
        pytest.param("extra-after-body", zmq.DEALER, id="dealer-extra-frame"),
        pytest.param("empty", zmq.DEALER, id="dealer-empty-body"),
        pytest.param("extra-after-body", zmq.REQ, id="req-extra-frame"),
    ],
)
def test_malformed_framing_is_answered_not_dropped(
    stack: Stack, frames: str, socket_type: int
) -> None:
    rid = new_id()
    body = _enc.encode(_request(_directive(), rid))
    sent = [body, b"trailing"] if frames == "extra-after-body" else [b""]
    reply = _reply(_call(stack, sent, socket_type))
    assert not reply.ok and reply.error is not None
    assert reply.error.code == "request-malformed"
    if frames == "extra-after-body":
        assert reply.request_id == rid and "one body frame" in reply.error.message


def test_a_decodable_map_with_a_bad_field_still_names_its_request(stack: Stack) -> None:
    rid = new_id()
    req = _request(_directive(schema="not-a-directive"), rid)
    reply = _reply(_call(stack, [_enc.encode(req)]))
    assert not reply.ok and reply.error is not None
    assert reply.request_id == rid
    assert reply.error.path == "$.directive.schema", reply.error


def test_an_invoke_without_a_directive_is_directive_missing(stack: Stack) -> None:
    rid = new_id()
    body = _enc.encode({"request/id": rid, "method": "sensorium.directive.invoke"})
    reply = _reply(_call(stack, [body]))
    assert not reply.ok and reply.error is not None
    assert (reply.request_id, reply.error.code, reply.error.path) == (
        rid,
        "directive-missing",
        "$.directive",
    )
