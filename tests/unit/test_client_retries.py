"""Lazy Pirate retries of ``Client.invoke`` and ``AsyncClient.invoke``, against a scripted
core: the real RPC server on a real ipc socket (in a thread of its own for the blocking
client), failing attempts as told before it answers."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import zmq.asyncio

from sensorium.client import (
    AsyncClient,
    Client,
    InDoubt,
    Overloaded,
    ParametersInvalid,
    ReplyTimeout,
    Unavailable,
)
from sensorium.client import api as client_api
from sensorium.client import deferred as api
from sensorium.shared.clock import rfc3339
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.wire.client_api import ClientRequest, Invoke
from sensorium.shared.wire.deferred import DeferredOperation
from sensorium.shared.wire.outcome import Outcome

OP = "deferred:sensorium.directive.invoke:01RETRY"


_SOCKETS = tempfile.mkdtemp(prefix="cr-", dir="/tmp")
atexit.register(shutil.rmtree, _SOCKETS, True)


def _endpoint() -> str:
    return f"ipc://{tempfile.mkdtemp(dir=_SOCKETS)}/core.sock"


class FlakyCore:
    """Fails the first attempts with ``failures`` (a code each; ``"silence"`` answers too
    late), then answers; remembers every Invoke it saw."""

    def __init__(self, failures: list[str], retry_after_ms: int = 50) -> None:
        self.failures = list(failures)
        self.retry_after_ms = retry_after_ms
        self.seen: list[Invoke] = []

    async def invoke(self, req: Invoke) -> Outcome | DeferredOperation:
        self.seen.append(req)
        if self.failures:
            code = self.failures.pop(0)
            if code == "silence":
                await asyncio.sleep(1.0)  # past the caller's reply wait: a lost reply
            else:
                raise CodedError(code, f"scripted {code}", retry_after_ms=self.retry_after_ms)
        d = req.directive
        if d.timing.mode == "async":
            now = time.time()
            return DeferredOperation(
                operation_id=OP,
                retry_after_seconds=1,
                created_at=rfc3339(now),
                expires_at=rfc3339(now + 60),
                cancel_href=f"sensorium.operation.cancel?operation/id={OP}",
            )
        return Outcome(
            outcome_id="o",
            directive_id=d.directive_id,
            action_id=d.action_id,
            status="completed",
            started_at=rfc3339(),
            duration_ms=1.0,
            timeout_ms=1000,
        )

    def directive_ids(self) -> set[str]:
        return {r.directive.directive_id for r in self.seen}

    def keys(self) -> set[str | None]:
        return {r.directive.idempotency_key for r in self.seen}


def _server(ctx: zmq.asyncio.Context, endpoint: str, core: FlakyCore) -> RpcServer:
    server = RpcServer(ctx, endpoint, ClientRequest, {Invoke: core.invoke}, name="flaky-core")
    server.bind()
    return server


@contextlib.contextmanager
def core_thread(core: FlakyCore, endpoint: str, delay_s: float = 0.0) -> Iterator[None]:
    """The scripted core served from its own thread and event loop (bound after
    ``delay_s``), for the blocking client."""
    ready = threading.Event()
    stop: list[asyncio.Event] = []
    loop_box: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        await asyncio.sleep(delay_s)
        ctx = zmq.asyncio.Context()
        server = _server(ctx, endpoint, core)
        task = asyncio.create_task(server.serve())
        stop.append(asyncio.Event())
        loop_box.append(asyncio.get_running_loop())
        ready.set()
        await stop[0].wait()
        task.cancel()
        server.close()
        ctx.term()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    try:
        yield
    finally:
        ready.wait(delay_s + 5)
        loop_box[0].call_soon_threadsafe(stop[0].set)
        thread.join(5)


def _client(endpoint: str) -> Client:
    return Client(endpoint, connect_timeout_s=0.5)


def test_retries_default_to_three_with_a_key_and_to_none_without() -> None:
    assert api.retry_plan(None, "k") == (3, "k")
    assert api.retry_plan(None, None) == (0, None)
    n, key = api.retry_plan(2, None)
    assert n == 2 and key is not None and len(key) == 26  # a ULID
    assert api.retry_plan(0, None) == (0, None)
    with pytest.raises(ValueError, match="count"):
        api.retry_plan(-1, None)
    for _ in range(50):
        err = Overloaded("overloaded", "x", retry_after_ms=10_000)
        assert api.retry_pause_s(err) == api.MAX_RETRY_PAUSE_S
        err = Overloaded("overloaded", "x", retry_after_ms=1)
        assert api.retry_pause_s(err) == api.MIN_RETRY_PAUSE_S
        err = Overloaded("overloaded", "x", retry_after_ms=500)
        assert 0.4 <= api.retry_pause_s(err) <= 0.6  # jittered
        assert 0.8 <= api.retry_pause_s(err, 1) <= 1.2  # doubled for the second retry
        assert api.retry_pause_s(err, 3) == api.MAX_RETRY_PAUSE_S


def test_a_keyless_invoke_is_sent_once() -> None:
    endpoint, core = _endpoint(), FlakyCore(["overloaded"])
    with core_thread(core, endpoint), _client(endpoint) as client:
        with pytest.raises(Overloaded) as err:
            client.invoke("test.x", reply_timeout_s=2)
        assert len(core.seen) == 1 and core.keys() == {None}
        assert "attempts" not in err.value.detail


def test_retries_resend_the_same_directive_under_one_key_with_fresh_request_ids() -> None:
    endpoint = _endpoint()
    core = FlakyCore(["core-unavailable", "overloaded", "storage-unavailable"])
    with core_thread(core, endpoint), _client(endpoint) as client:
        t0 = time.monotonic()
        outcome = client.invoke("test.x", {"a": 1}, retries=3, reply_timeout_s=2)
        assert outcome.status == "completed"
        assert time.monotonic() - t0 < 2  # three pauses of ~50 ms
    assert len(core.seen) == 4
    assert len({r.request_id for r in core.seen}) == 4
    assert core.directive_ids() == {outcome.directive_id}
    (key,) = core.keys()
    assert key is not None and len(key) == 26  # made up by the client, kept throughout


def test_in_doubt_and_refusals_are_final() -> None:
    for code, cls in (("outcome-in-doubt", InDoubt), ("parameters-invalid", ParametersInvalid)):
        endpoint, core = _endpoint(), FlakyCore([code])
        with core_thread(core, endpoint), _client(endpoint) as client, pytest.raises(cls):
            client.invoke("test.x", idempotency_key="k-final", reply_timeout_s=2)
        assert len(core.seen) == 1


def test_spent_retries_raise_the_last_retryable_error_naming_attempts_and_key() -> None:
    endpoint = _endpoint()
    core = FlakyCore(["overloaded", "overloaded", "connector-unavailable", "overloaded"])
    with (
        core_thread(core, endpoint),
        _client(endpoint) as client,
        pytest.raises(Unavailable) as err,
    ):
        client.invoke("test.x", idempotency_key="k-spent", retries=2, reply_timeout_s=2)
    assert len(core.seen) == 3
    assert err.value.code == "connector-unavailable"
    assert err.value.detail == {"attempts": "3", "idempotency/key": "k-spent"}


def test_a_reply_timeout_drops_the_socket_and_the_retry_gets_the_answer() -> None:
    endpoint, core = _endpoint(), FlakyCore(["silence"])
    with core_thread(core, endpoint), _client(endpoint) as client:
        first_socket = client._rpc
        outcome = client.invoke("test.x", idempotency_key="k-lazy", reply_timeout_s=0.3)
        assert outcome.status == "completed"
        assert client._rpc is not first_socket  # Lazy Pirate: a fresh connection
        # The late reply of the first attempt went with the old socket; the new one
        # carries the next call's reply and nothing else.
        assert client.invoke("test.x", reply_timeout_s=2).status == "completed"
    assert len(core.seen) == 3


class _Clock:
    """The client's ``time`` module, with its pauses recorded instead of slept."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def test_no_retry_is_sent_past_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = _endpoint()
    core = FlakyCore(["overloaded"] * 10, retry_after_ms=2000)
    deadline = datetime.now(UTC) + timedelta(seconds=0.5)
    clock = _Clock()
    monkeypatch.setattr(client_api, "time", clock)
    with (
        core_thread(core, endpoint),
        _client(endpoint) as client,
        pytest.raises(Overloaded) as err,
    ):
        client.invoke("test.x", idempotency_key="k-dl", deadline_at=deadline, reply_timeout_s=2)
    # Nor did it sleep the 2 s hint first: a pause past the deadline ends the invoke.
    assert clock.pauses == []
    assert len(core.seen) == 1 and err.value.detail["attempts"] == "1"


def test_a_client_started_before_core_gets_its_answer_once_core_binds() -> None:
    endpoint, core = _endpoint(), FlakyCore([])
    with core_thread(core, endpoint, delay_s=1.0), _client(endpoint) as client:
        t0 = time.monotonic()
        outcome = client.invoke("test.x", retries=4, reply_timeout_s=2)
        assert outcome.status == "completed" and time.monotonic() - t0 >= 0.9
    assert len(core.seen) == 1  # the attempts before core bound never left the client


def test_async_client_retries_sync_and_deferred_invokes() -> None:
    async def main() -> None:
        endpoint = _endpoint()
        core = FlakyCore(["overloaded", "reply-timeout", "shutting-down"])
        ctx = zmq.asyncio.Context()
        server = _server(ctx, endpoint, core)
        task = asyncio.create_task(server.serve())
        client = AsyncClient(endpoint)
        try:
            await client.wait_connected()
            op = await client.invoke("test.x", mode="async", idempotency_key="k-async")
            assert isinstance(op, DeferredOperation) and op.operation_id == OP
            assert len(core.seen) == 4 and core.keys() == {"k-async"}
            assert len(core.directive_ids()) == 1
            core.failures = ["silence"]
            outcome = await client.invoke("test.x", retries=1, reply_timeout_s=0.3)
            assert isinstance(outcome, Outcome)
            core.failures = ["overloaded"]
            with pytest.raises(Overloaded):
                await client.invoke("test.x", reply_timeout_s=2)  # no key: once
            core.failures = ["outcome-in-doubt"]
            n = len(core.seen)
            with pytest.raises(InDoubt):
                await client.invoke("test.x", idempotency_key="k-doubt")
            assert len(core.seen) == n + 1
        finally:
            await client.close()
            task.cancel()
            server.close()
            ctx.term()

    asyncio.run(main())


def test_a_reply_timeout_with_retries_spent_is_still_a_reply_timeout() -> None:
    endpoint, core = _endpoint(), FlakyCore(["silence", "silence"])
    with core_thread(core, endpoint), _client(endpoint) as client:
        t0 = time.monotonic()
        with pytest.raises(ReplyTimeout) as err:
            client.invoke("test.x", retries=1, reply_timeout_s=0.3)
        # Two attempts of 0.3 s and one pause of ~1 s (the reply-timeout hint).
        assert time.monotonic() - t0 < 3
    assert err.value.detail["attempts"] == "2"
