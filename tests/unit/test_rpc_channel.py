"""The Channel (shared/rpc/channel.py) over real ZeroMQ sockets.

libzmq's fd signals a *change*, and a send or a ``ZMQ_EVENTS`` read spends the signal.
A receive loop that slept on the fd while a send spent the signal of a message that
had just arrived would never wake: these tests make that interleaving happen by the
thousand, counted, never timed (the timeouts only turn a hang into a failure).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import tempfile
import time

import pytest
import zmq
import zmq.asyncio

from sensorium.shared.rpc.channel import PUMP_BATCH, Channel, blocking_socket, monitor_of

HANG_S = 60.0  # a failure guard only: a healthy run takes a fraction of it


def _endpoint() -> str:
    return f"ipc://{tempfile.mkdtemp(prefix='chan-', dir='/tmp')}/s.sock"


async def _pair(ctx: zmq.asyncio.Context) -> tuple[Channel, Channel]:
    endpoint = _endpoint()
    router = blocking_socket(ctx, zmq.ROUTER)
    router.bind(endpoint)
    dealer = blocking_socket(ctx, zmq.DEALER)
    dealer.connect(endpoint)
    return Channel(router), Channel(dealer)


@pytest.mark.parametrize("pumped", [False, True], ids=["recv", "pump"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replies_sent_late_and_interleaved_all_arrive(seed: int, pumped: bool) -> None:
    """A server that answers out of order, sending while its receive loop sleeps, and
    clients that send while theirs sleep: every message arrives, none twice. Both ways
    a server receives: a loop of ``recv_multipart``, or ``pump``'s callback."""
    rng = random.Random(seed)
    clients_n, per_client = 8, 250

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        endpoint = _endpoint()
        router = Channel(blocking_socket(ctx, zmq.ROUTER))
        router.sock.bind(endpoint)
        held: list[list[bytes]] = []

        def take(raw: list[zmq.Frame]) -> None:
            held.append([f.bytes for f in raw])
            # Answer a random few of those held, so sends land at every point of the
            # receive loop's sleep and wake.
            while held and rng.random() < 0.6:
                router.send_multipart(held.pop(rng.randrange(len(held))))
            if len(held) > 4:
                router.send_multipart(held.pop(0))

        async def serve() -> None:
            if pumped:
                await router.pump(take)
            while True:
                take(await router.recv_multipart())

        async def flush() -> None:
            while True:
                await asyncio.sleep(0)
                if held and rng.random() < 0.3:
                    router.send_multipart(held.pop(0))

        async def client(k: int) -> list[int]:
            dealer = Channel(blocking_socket(ctx, zmq.DEALER))
            dealer.sock.connect(endpoint)
            got: list[int] = []
            sent = 0
            try:
                while len(got) < per_client:
                    while sent < per_client and sent - len(got) < 3:
                        dealer.send(f"{k}:{sent}".encode())
                        sent += 1
                    got.append(int((await dealer.recv()).split(b":")[1]))
            finally:
                dealer.close()
            return got

        tasks = [asyncio.create_task(serve()), asyncio.create_task(flush())]
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(client(k) for k in range(clients_n))), HANG_S
            )
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            router.close()
            ctx.term()
        for got in results:
            assert sorted(got) == list(range(per_client))

    asyncio.run(main())


def test_a_send_that_spends_the_signal_of_an_arrival_still_wakes_the_receiver() -> None:
    """The hazard itself, made to happen: while the receive loop sleeps, a message
    arrives, and a send on the same socket (past libzmq's ~1 ms command throttle)
    processes the socket's commands, spending the fd's signal before the loop sees it."""

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router, dealer = await _pair(ctx)
        try:
            dealer.send(b"hello")
            ident = (await asyncio.wait_for(router.recv_multipart(), HANG_S))[0].bytes
            for i in range(20):
                receiving = asyncio.create_task(router.recv_multipart())
                await asyncio.sleep(0)  # it finds nothing and sleeps on the fd
                dealer.send(str(i).encode())
                time.sleep(0.01)  # blocking: the message lands, the throttle passes
                router.send_multipart([ident, b"spend"])
                frames = await asyncio.wait_for(receiving, HANG_S)
                assert frames[-1].bytes == str(i).encode()
                assert await asyncio.wait_for(dealer.recv(), HANG_S) == b"spend"
        finally:
            router.close()
            dealer.close()
            ctx.term()

    asyncio.run(main())


def test_a_pump_hands_over_an_arrival_whose_signal_a_send_spent_in_its_own_context() -> None:
    """The same hazard for ``pump``: while it sleeps, a message arrives and a send from
    another task spends the fd's signal. The message is still handed over, and in the
    context the pump was started in, not the sender's (whose variables, a handler's
    bound request id say, must not leak into the next request's path)."""
    who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="owner")

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router, dealer = await _pair(ctx)
        seen: asyncio.Queue[tuple[bytes, bytes, str]] = asyncio.Queue()
        pumping = asyncio.create_task(
            router.pump(lambda raw: seen.put_nowait((raw[0].bytes, raw[-1].bytes, who.get())))
        )

        async def sender(ident: bytes, i: int) -> None:
            who.set("sender")
            await asyncio.sleep(0)  # the pump finds nothing and sleeps on the fd
            dealer.send(str(i).encode())
            time.sleep(0.01)  # blocking: the message lands, the throttle passes
            router.send_multipart([ident, b"spend"])

        try:
            dealer.send(b"hello")
            ident = (await asyncio.wait_for(seen.get(), HANG_S))[0]
            for i in range(20):
                await asyncio.create_task(sender(ident, i))
                _ident, body, context = await asyncio.wait_for(seen.get(), HANG_S)
                assert (body, context) == (str(i).encode(), "owner")
                assert await asyncio.wait_for(dealer.recv(), HANG_S) == b"spend"
        finally:
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
            router.close()
            dealer.close()
            ctx.term()

    asyncio.run(main())


def test_a_pump_hands_over_a_flood_in_order_and_lets_the_loop_run_between() -> None:
    """More than one callback's batch queued before the pump starts: all of it, in
    order, and other tasks of the loop run before the last batch is taken."""

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router, dealer = await _pair(ctx)
        total = 5 * PUMP_BATCH + 3
        seen: list[int] = []
        ticks: list[int] = []  # how many had been handed over at each tick of another task
        all_in = asyncio.Event()

        def take(raw: list[zmq.Frame]) -> None:
            seen.append(int(raw[-1].bytes))
            if len(seen) == total:
                all_in.set()

        async def ticker() -> None:
            while not all_in.is_set():
                ticks.append(len(seen))
                await asyncio.sleep(0)

        for i in range(total):
            dealer.send(str(i).encode())
        while router.sock.get(zmq.EVENTS) & zmq.POLLIN == 0:  # wait until queued
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        pumping = asyncio.create_task(router.pump(take))
        ticking = asyncio.create_task(ticker())
        try:
            await asyncio.wait_for(all_in.wait(), HANG_S)
            assert seen == list(range(total))
            assert any(0 < n < total for n in ticks), ticks
        finally:
            pumping.cancel()
            ticking.cancel()
            await asyncio.gather(pumping, ticking, return_exceptions=True)
            router.close()
            dealer.close()
            ctx.term()

    asyncio.run(main())


def test_a_pump_ends_with_its_handlers_error_or_the_close() -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router, dealer = await _pair(ctx)

        def take(raw: list[zmq.Frame]) -> None:
            raise LookupError(raw[-1].bytes.decode())

        pumping = asyncio.create_task(router.pump(take))
        dealer.send(b"boom")
        with pytest.raises(LookupError, match="boom"):
            await asyncio.wait_for(pumping, HANG_S)
        pumping = asyncio.create_task(router.pump(lambda raw: None))
        await asyncio.sleep(0)
        router.close()
        with pytest.raises(zmq.ZMQError):
            await asyncio.wait_for(pumping, HANG_S)
        dealer.close()
        ctx.term()

    asyncio.run(main())


def test_a_message_queued_before_the_first_wait_is_received() -> None:
    """Messages that arrived before anyone registered on the fd, and a burst drained
    without a sleep in between."""

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router, dealer = await _pair(ctx)
        try:
            for i in range(100):
                dealer.send(str(i).encode())
            seen = []
            for _ in range(100):
                frames = await asyncio.wait_for(router.recv_multipart(), HANG_S)
                seen.append(int(frames[-1].bytes))
            assert seen == list(range(100))
        finally:
            router.close()
            dealer.close()
            ctx.term()

    asyncio.run(main())


def test_close_wakes_a_waiting_receiver_with_an_error() -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router, dealer = await _pair(ctx)
        receiving = asyncio.create_task(dealer.recv())
        await asyncio.sleep(0)
        dealer.close()
        with pytest.raises(zmq.ZMQError):
            await asyncio.wait_for(receiving, HANG_S)
        router.close()
        ctx.term()

    asyncio.run(main())


def test_monitor_of_reports_connection_events() -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        endpoint = _endpoint()
        router = blocking_socket(ctx, zmq.ROUTER)
        router.bind(endpoint)
        dealer = blocking_socket(ctx, zmq.DEALER)
        monitor = Channel(monitor_of(dealer, zmq.EVENT_HANDSHAKE_SUCCEEDED))
        dealer.connect(endpoint)
        parts = await asyncio.wait_for(monitor.recv_parts(), HANG_S)
        assert int.from_bytes(parts[0][:2], "little") == zmq.EVENT_HANDSHAKE_SUCCEEDED
        dealer.disable_monitor()
        monitor.close()
        dealer.close(linger=0)
        router.close(linger=0)
        ctx.term()

    asyncio.run(main())
