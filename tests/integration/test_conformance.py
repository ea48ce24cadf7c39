"""The language-neutral conformance vectors (schemas/conformance/) against a live node:
the bytes a client in any language can send, and what the reply must hold."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from harness import Stack

from sensorium.client.endpoint import core_endpoint

VECTORS = Path(__file__).resolve().parents[2] / "schemas" / "conformance"
CASES = sorted(p.stem for p in VECTORS.glob("*.msgpack"))


def _unrender(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$bin"}:
            return base64.b64decode(value["$bin"])
        if set(value) == {"$timestamp"}:
            return dt.datetime.fromisoformat(value["$timestamp"].replace("Z", "+00:00"))
        return {k: _unrender(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unrender(v) for v in value]
    return value


def _holds(actual: Any, expected: Any, where: str = "$") -> None:
    """``expected`` is a subset of ``actual``: maps by key, lists element by element."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected a map, got {actual!r}"
        for k, v in expected.items():
            assert k in actual, f"{where}: no {k!r} in {sorted(actual)}"
            _holds(actual[k], v, f"{where}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) >= len(expected), f"{where}: {actual!r}"
        for i, v in enumerate(expected):
            _holds(actual[i], v, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def test_there_are_vectors_and_each_json_renders_its_bytes() -> None:
    assert len(CASES) >= 12
    for name in CASES:
        doc = json.loads((VECTORS / f"{name}.json").read_text())
        raw = (VECTORS / f"{name}.msgpack").read_bytes()
        if "$raw" in doc["request"]:
            assert raw == base64.b64decode(doc["request"]["$raw"]), name
        else:
            assert msgspec.msgpack.decode(raw) == _unrender(doc["request"]), name


@pytest.mark.parametrize("name", CASES)
def test_a_live_node_answers_each_vector_as_written(stack: Stack, name: str) -> None:
    doc = json.loads((VECTORS / f"{name}.json").read_text())
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(core_endpoint(state_dir=str(stack.paths.root)))
    try:
        sock.send((VECTORS / f"{name}.msgpack").read_bytes())
        assert sock.poll(30_000), f"{name}: no reply"
        reply = msgspec.msgpack.decode(sock.recv())
    finally:
        sock.close()
    _holds(reply, doc["expect"])
