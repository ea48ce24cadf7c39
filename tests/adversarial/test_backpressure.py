"""Backpressure at the front door: past core's in-flight bound a caller is told
`overloaded` at once, with a retry hint, while the admitted work completes; a caller
that never reads its replies cannot stall anybody else; memory stays bounded."""

from __future__ import annotations

import asyncio
import time

import msgspec
import psutil
import zmq
from harness import TEST_ACTIONS, Stack, running_stack

from sensorium.client import AsyncClient, Overloaded, SensoriumError
from sensorium.shared.config import core_endpoint, load_node_config
from sensorium.shared.ids import new_id
from sensorium.shared.wire.client_api import Health

NODE = {"limits": {"core_max_inflight": 6, "connector_max_concurrent_spawns": 64}}


def test_past_cores_bound_callers_are_told_overloaded_at_once_and_admitted_work_completes() -> None:
    with running_stack(TEST_ACTIONS, node=NODE) as stack:
        arrivals: list[str] = []  # each answer's status or code, in the order they came

        async def one(c: AsyncClient) -> tuple[str, int, int | None]:
            try:
                out = await c.invoke("test.sleep", {"seconds": 1.5}, retries=0)
                arrivals.append(out.status)
                return out.status, len(arrivals), None
            except SensoriumError as exc:
                arrivals.append(exc.code)
                return exc.code, len(arrivals), exc.retry_after_ms

        async def main() -> list[tuple[str, int, int | None]]:
            async with AsyncClient(state_dir=str(stack.paths.root)) as c:
                return await asyncio.gather(*(one(c) for _ in range(30)))

        results = asyncio.run(main())
        done = [r for r in results if r[0] == "completed"]
        refused = [r for r in results if r[0] == "overloaded"]
        assert len(done) + len(refused) == len(results), results
        assert 1 <= len(done) <= 6 and refused, results
        # Refused at once, not queued: every refusal came before the first run ended.
        first_done = min(order for _s, order, _h in done)
        assert all(order < first_done and hint and hint > 0 for _c, order, hint in refused)
        _serves(stack)


def test_a_caller_that_never_reads_cannot_stall_the_others() -> None:
    with running_stack(TEST_ACTIONS, node=NODE) as stack:
        endpoint = core_endpoint(load_node_config(stack.paths), stack.paths)
        ctx = zmq.Context()
        rude = ctx.socket(zmq.DEALER)
        rude.setsockopt(zmq.LINGER, 0)
        rude.setsockopt(zmq.RCVHWM, 1)
        rude.setsockopt(zmq.RCVBUF, 4096)
        rude.connect(endpoint)
        core = psutil.Process(stack.pids()["core"] or 0)
        rss_before = core.memory_info().rss
        body = msgspec.msgpack.encode(Health(request_id="x"))
        try:
            # Far more requests than core may hold, and none of the replies read.
            for _ in range(20_000):
                try:
                    rude.send(body, zmq.NOBLOCK)
                except zmq.Again:
                    break
            time.sleep(1.0)
            _serves(stack)
            assert core.memory_info().rss - rss_before < 200 * 1024 * 1024
        finally:
            rude.close(0)
            ctx.term()


def _serves(stack: Stack) -> None:
    """A polite caller still gets answers (retrying an `overloaded`, as it is told)."""
    deadline = time.monotonic() + 10
    with stack.client() as c:
        while True:
            try:
                assert c.health().process == "core"
                out = c.invoke("test.echo-args", {"value": new_id()}, retries=0)
                assert out.status == "completed"
                return
            except Overloaded as exc:
                assert time.monotonic() < deadline, "core stayed overloaded"
                time.sleep((exc.retry_after_ms or 100) / 1000)
