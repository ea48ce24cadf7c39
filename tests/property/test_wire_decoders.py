"""Frames built to break the wire decoders: the client API and seam request unions as
RpcServer decodes them, and replies and their results as clients do.

Invariant: a frame either decodes to a request that re-encodes to itself, or is refused
with request-malformed / request-too-large; nothing else escapes, nothing hangs. The
real-socket checks of core (tests/adversarial/test_hostile_requests.py) are not repeated:
here an in-process RpcServer on a real ipc socket takes a few hundred generated frames.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fuzz_examples as ex
import fuzz_strategies as hs
import msgspec
import pytest
import zmq
import zmq.asyncio
from fuzz_targets import (
    ACCEPTED,
    PROPERTY,
    REPLY_MALFORMED,
    bounded,
    client_request,
    reply,
    result,
    seam_request,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from sensorium.shared.diagnostics import ALL_CODES, OsErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.wire.client_api import ClientRequest
from sensorium.shared.wire.directive import (
    PARAMETERS_MAX_DEPTH,
    Issuer,
    ParametersRefused,
    new_directive,
)
from sensorium.shared.wire.envelope import Reply

_enc = msgspec.msgpack.Encoder()


@PROPERTY
@given(st.sampled_from(ex.CLIENT_REQUESTS).flatmap(hs.msgpack_bytes))
def test_client_requests_decode_or_are_refused_with_a_code(payload: bytes) -> None:
    with bounded():
        assert client_request(payload) in {ACCEPTED, "request-malformed"}


@PROPERTY
@given(st.sampled_from(ex.SEAM_REQUESTS).flatmap(hs.msgpack_bytes))
def test_seam_requests_decode_or_are_refused_with_a_code(payload: bytes) -> None:
    with bounded():
        assert seam_request(payload) in {ACCEPTED, "request-malformed"}


@PROPERTY
@given(hs.msgpack_bytes(ex.REPLY))
def test_replies_decode_or_raise_only_what_clients_expect(payload: bytes) -> None:
    # REPLY_MALFORMED has no code: rpc/client.py logs and drops the frame (see the report
    # of issue 6: it catches msgspec.DecodeError only, not UnicodeDecodeError/RecursionError).
    with bounded():
        verdict = reply(payload)
    assert verdict in {ACCEPTED, REPLY_MALFORMED} or verdict in ALL_CODES


@settings(PROPERTY, max_examples=200)
@given(
    st.sampled_from(["outcome", "deferred", "status", "connector-deferred"]).flatmap(
        lambda kind: st.tuples(
            hs.msgpack_bytes(
                {
                    "outcome": ex.OUTCOME,
                    "deferred": ex.DEFERRED,
                    "status": ex.DEFERRED_STATUS,
                    "connector-deferred": ex.CONNECTOR_DEFERRED,
                }[kind]
            ),
            st.just(kind),
        )
    )
)
def test_reply_results_decode_or_raise_only_decode_errors(case: tuple[bytes, str]) -> None:
    with bounded():
        assert result(*case) in {ACCEPTED, REPLY_MALFORMED}


# --- caps on a directive's parameters ------------------------------------------------


def _invoke(parameters: Any) -> bytes:
    directive = {**ex.DIRECTIVE, "parameters": parameters}
    return _enc.encode(
        {"request/id": "r", "method": "sensorium.directive.invoke", "directive": directive}
    )


@pytest.mark.parametrize("depth", [PARAMETERS_MAX_DEPTH, 500, 980, 10_000])
def test_parameters_nested_past_the_cap_are_request_malformed(depth: int) -> None:
    # parameters is level 1, so depth lists inside "v" make depth + 1 levels.
    nested = msgspec.Raw(b"\x91" * depth + b"\xc0")
    assert client_request(_invoke({"v": nested})) == "request-malformed"
    assert (
        client_request(_invoke({"v": msgspec.Raw(b"\x91" * (PARAMETERS_MAX_DEPTH - 1) + b"\xc0")}))
        == ACCEPTED
    )


def test_a_huge_flat_parameter_is_left_to_the_schema_and_the_request_cap() -> None:
    # core answers parameters-invalid for it (tests/adversarial), and the argv cap
    # refuses it at render; the decoder only bounds the depth.
    assert client_request(_invoke({"v": "x" * 3_000_000})) == ACCEPTED
    assert client_request(_invoke({"v": "x" * 5_000_000})) == "request-too-large"
    with pytest.raises(msgspec.ValidationError, match="parameters-invalid: parameters are"):
        msgspec.msgpack.decode(_invoke({"v": _deep(PARAMETERS_MAX_DEPTH)}), type=ClientRequest)


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "parameters",
    [{"n": 2**64}, {"n": -(2**63) - 1}, {"n": object()}, {"v": _deep(PARAMETERS_MAX_DEPTH)}],
)
def test_a_directive_built_in_process_is_refused_with_a_code(parameters: dict[str, Any]) -> None:
    """What the client library and core's flows build: parameters no hop could carry get
    parameters-invalid at once, not an OverflowError or TypeError at the first encode."""
    with pytest.raises(ParametersRefused) as info:
        new_directive("a.b", parameters, issuer=Issuer(module_id="sensorium.tests"))
    assert isinstance(info.value, CodedError) and info.value.code == OsErrorCode.PARAMETERS_INVALID
    new_directive(
        "a.b", {"v": _deep(PARAMETERS_MAX_DEPTH - 1)}, issuer=Issuer(module_id="sensorium.tests")
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e308, 2**64 - 1, -(2**63)])
def test_numbers_msgpack_carries_decode_and_round_trip(value: float) -> None:
    assert client_request(_invoke({"v": value})) == ACCEPTED


# --- the real server on a real socket ------------------------------------------------


class _Ack(msgspec.Struct, frozen=True):
    ok: bool = True


async def _ack(_request: Any) -> _Ack:
    return _Ack()


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, RpcServer]]:
    """An RpcServer serving ClientRequest on ipc, in its own thread and loop."""
    root = Path(tempfile.mkdtemp(prefix="fz-", dir="/tmp"))
    endpoint = f"ipc://{root}/fuzz.sock"
    handlers = {t: _ack for t in ClientRequest.__args__}
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        async def main() -> None:
            ctx = zmq.asyncio.Context()
            srv = RpcServer(
                ctx, endpoint, ClientRequest, handlers, name="fuzz", max_message=1 << 20
            )
            srv.bind()
            holder["server"], holder["loop"] = srv, asyncio.get_running_loop()
            task = srv.start(lambda: None)
            holder["task"] = task
            ready.set()
            try:
                await task
            except asyncio.CancelledError:
                pass
            finally:
                srv.close()
                ctx.term()

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield endpoint, holder["server"]
    finally:
        holder["loop"].call_soon_threadsafe(holder["task"].cancel)
        thread.join(10)


@settings(PROPERTY, max_examples=150)
@given(
    st.one_of(
        st.sampled_from(ex.CLIENT_REQUESTS).flatmap(hs.msgpack_bytes),
        st.integers(1 << 20, (1 << 20) + 64).map(lambda n: b"\x00" * (n + 1)),
    )
)
def test_a_real_rpc_server_answers_every_frame_with_a_coded_reply(
    server: tuple[str, RpcServer], payload: bytes
) -> None:
    endpoint, srv = server
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(payload)
        assert sock.poll(5000), "no reply within 5 s"
        answer = msgspec.msgpack.decode(sock.recv(), type=Reply)
    finally:
        sock.close()
    if answer.ok:
        assert client_request(payload) == ACCEPTED
    else:
        assert answer.error is not None and answer.error.code in ALL_CODES
        expected = "request-too-large" if len(payload) > 1 << 20 else "request-malformed"
        assert answer.error.code == expected, answer.error
    assert srv.crash is None
