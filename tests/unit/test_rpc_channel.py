"""The Channel (shared/rpc/channel.py) over real ZeroMQ sockets.

libzmq's fd signals a *change*, and a send or a ``ZMQ_EVENTS`` read spends the signal.
A receive loop that slept on the fd while a send spent the signal of a message that
had just arrived would never wake: these tests make that interleaving happen by the
thousand, counted, never timed (the timeouts only turn a hang into a failure).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time

import pytest
import zmq
import zmq.asyncio

from sensorium.shared.rpc.channel import Channel, blocking_socket, monitor_of

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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replies_sent_late_and_interleaved_all_arrive(seed: int) -> None:
    """A server that answers out of order, sending while its receive loop sleeps, and
    clients that send while theirs sleep: every message arrives, none twice."""
    rng = random.Random(seed)
    clients_n, per_client = 8, 250

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        endpoint = _endpoint()
        router = Channel(blocking_socket(ctx, zmq.ROUTER))
        router.sock.bind(endpoint)
        held: list[list[bytes]] = []

        async def serve() -> None:
            while True:
                frames = [f.bytes for f in await router.recv_multipart()]
                held.append(frames)
                # Answer a random few of those held, so sends land at every point of
                # the receive loop's sleep and wake.
                while held and rng.random() < 0.6:
                    router.send_multipart(held.pop(rng.randrange(len(held))))
                if len(held) > 4:
                    router.send_multipart(held.pop(0))

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
