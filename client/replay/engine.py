"""The open-loop sender: every request goes out when it is due, answered or not.

One thread, ``concurrency`` DEALER connections to core taken in turn, a zmq poll
that sleeps until the next request is due or a reply arrives. The tool never waits
for a reply before sending the next request, so a slow server meets the same
offered load as a fast one; at most ``max_inflight`` requests are outstanding (the
tool's memory bound), and a plan that would pass it is delayed, which the latency
— measured from when each request was due — then shows. Requests are sent with
1 ms granularity (the poll's); ``send_lag_ms`` in the report is how late the tool
itself was.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import zmq

from sensorium.client.replay.plan import Planned
from sensorium.client.replay.report import Tally
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.rpc.curve import ClientKeys

# Ahead of the first due request, so connections are up before the clock starts.
LEAD_NS = 50_000_000
# Progress callbacks at most this often.
PROGRESS_NS = 500_000_000
_HWM = 1_000_000


class _Coded(msgspec.Struct):
    code: str = ""


class _ResultHead(msgspec.Struct):
    """An outcome's or an operation's status and first codes; other results have none."""

    status: str | None = None
    diagnostics: list[_Coded] = []


class _ReplyHead(msgspec.Struct):
    """The part of a ``sensorium-reply.v1`` the tally needs."""

    request_id: str = msgspec.field(name="request/id")
    ok: bool = False
    error: _Coded | None = None
    result: _ResultHead | None = None


# A result with one of these statuses answered, but the action did not succeed (an
# invoke's refusal is a `rejected` result; `timed_out` is its published spelling).
FAILED_STATUSES = frozenset(
    {"failed", "timed-out", "timed_out", "rejected", "cancelled", "expired", "unknown"}
)


_reply = msgspec.msgpack.Decoder(_ReplyHead)


class Engine:
    def __init__(
        self,
        endpoint: str,
        *,
        concurrency: int = 1,
        max_inflight: int = 10_000,
        reply_timeout_s: float = 30.0,
        curve: ClientKeys | None = None,
    ) -> None:
        if concurrency < 1 or max_inflight < 1:
            raise ValueError("concurrency and max_inflight must be at least 1")
        if not reply_timeout_s > 0:
            raise ValueError("the reply timeout must be greater than 0")
        self.endpoint = endpoint
        self.concurrency = concurrency
        self.max_inflight = max_inflight
        self.reply_timeout_ns = int(reply_timeout_s * 1e9)
        self._curve = curve
        self.tally = Tally()
        self.started_ns = 0
        self.started_wall = 0.0
        self.last_sent_ns = 0
        self.finished_ns = 0

    def __repr__(self) -> str:
        return f"<Engine {self.endpoint} ×{self.concurrency} {self.tally!r}>"

    def run(
        self,
        plan: Iterator[Planned],
        progress: Callable[[float, Tally, int], None] | None = None,
    ) -> Tally:
        ctx = zmq.Context()
        socks: list[zmq.Socket[Any]] = []
        # The loop makes no reference cycles; a collector pass in the middle of a
        # send burst would only show up as the tool's own lateness.
        collecting = gc.isenabled()
        gc.disable()
        try:
            poller = zmq.Poller()
            for _ in range(self.concurrency):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, _HWM)
                sock.setsockopt(zmq.RCVHWM, _HWM)
                if self._curve is not None:
                    self._curve.apply(sock)
                sock.connect(self.endpoint)
                poller.register(sock, zmq.POLLIN)
                socks.append(sock)
            self._loop(plan, socks, poller, progress)
        finally:
            for sock in socks:
                sock.close(linger=0)
            ctx.term()
            if collecting:
                gc.enable()
        return self.tally

    def _loop(
        self,
        plan: Iterator[Planned],
        socks: list[zmq.Socket[Any]],
        poller: zmq.Poller,
        progress: Callable[[float, Tally, int], None] | None,
    ) -> None:
        t = self.tally
        clock = time.perf_counter_ns
        start = clock() + LEAD_NS
        self.started_ns = start
        # The plan reads this lazily to move recorded deadlines with their requests.
        self.started_wall = time.time() + LEAD_NS / 1e9
        # request/id -> (due, method); insertion order is due order, so the oldest
        # outstanding request is always the first one.
        pending: dict[str, int] = {}
        nxt = next(plan, None)
        turn = 0
        next_progress = start + PROGRESS_NS
        while nxt is not None or pending:
            now = clock()
            while nxt is not None and start + nxt.at_ns <= now and len(pending) < self.max_inflight:
                due = start + nxt.at_ns
                sock = socks[turn]
                turn = (turn + 1) % len(socks)
                t.by_method[nxt.method] += 1
                try:
                    sock.send(nxt.payload, zmq.NOBLOCK)
                except zmq.Again:
                    t.errors[RuntimeErrorCode.CORE_UNAVAILABLE.value] += 1
                else:
                    t.sent += 1
                    t.record_lag(now - due)
                    pending[nxt.request_id] = due
                    self.last_sent_ns = now
                nxt = next(plan, None)
            now = clock()
            if nxt is not None and len(pending) < self.max_inflight:
                wake = start + nxt.at_ns
            else:
                wake = now + 100_000_000  # only replies (or timeouts) can move things on
            if pending:  # ...and never past the oldest request's reply timeout
                wake = min(wake, pending[next(iter(pending))] + self.reply_timeout_ns)
            wait_ms = max(0, -(-(wake - now) // 1_000_000))
            for sock, _ in poller.poll(wait_ms):
                self._drain(sock, pending)
            now = clock()
            self._expire(pending, now)
            if progress is not None and now >= next_progress:
                progress((now - start) / 1e9, t, len(pending))
                next_progress = now + PROGRESS_NS
        self.finished_ns = clock()

    def _drain(self, sock: zmq.Socket[Any], pending: dict[str, int]) -> None:
        t = self.tally
        now = time.perf_counter_ns()
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                head = _reply.decode(frames[-1])
            except msgspec.DecodeError:
                t.unmatched += 1
                continue
            due = pending.pop(head.request_id, None)
            if due is None:
                t.unmatched += 1  # a reply after its request timed out, or not ours
                continue
            if now - due > self.reply_timeout_ns:
                # Answered, but later than the caller would have waited.
                t.errors[RuntimeErrorCode.REPLY_TIMEOUT.value] += 1
                continue
            t.answered += 1
            t.record_latency(now - due)
            if not head.ok:
                t.errors[head.error.code if head.error else "reply-malformed"] += 1
                continue
            status = head.result.status if head.result is not None else None
            if status is not None:
                t.outcomes[status] += 1
            if status in FAILED_STATUSES:
                assert head.result is not None
                first = head.result.diagnostics[0].code if head.result.diagnostics else ""
                t.errors[first or f"outcome-{status}"] += 1
            else:
                t.ok += 1

    def _expire(self, pending: dict[str, int], now: int) -> None:
        while pending:
            rid = next(iter(pending))
            if now - pending[rid] < self.reply_timeout_ns:
                return
            del pending[rid]
            self.tally.errors[RuntimeErrorCode.REPLY_TIMEOUT.value] += 1
