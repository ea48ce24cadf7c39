"""What a replay sends and when: requests from a recording, or a synthetic load.

A plan is a lazy iterator of :class:`Planned` requests, each with the offset from
the start of the run at which it is due. A recorded request is sent as a fresh
request: new ``request/id`` and ``directive/id`` (core would otherwise take it for
a retry of the original), its ``idempotency/key`` suffixed with the run's id (so
keyed requests dedup within the run as they did when recorded, but never against
the recorded run), and a ``timing.deadline_at`` moved by as much as the request
itself moved. A signed directive is sent unsigned (without ``signature`` and
``issuer_delegation``): its new ids are not what was signed, and the replay holds no
participant's key, so its issuer is the replayer's claim.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgspec

from sensorium.client.endpoint import module_id
from sensorium.shared.clock import parse_rfc3339, rfc3339
from sensorium.shared.ids import new_id
from sensorium.shared.wire.client_api import ClientRequest, Invoke
from sensorium.shared.wire.directive import DEFAULT_TIMEOUT_MS, Issuer, TimingMode, new_directive
from sensorium.shared.wire.recording import read_recording

REPLAY_MODULE_ID = "sensorium.replay"

MAX_KEY = 128


@dataclass(frozen=True, slots=True)
class Planned:
    at_ns: int  # due this long after the run starts
    payload: bytes
    request_id: str
    method: str


@dataclass
class PlanInfo:
    """What the report says about the plan; ``skipped`` grows as the plan is read."""

    source: str
    skipped: int = 0  # recorded requests that did not decode: nothing to rewrite


_decoder = msgspec.msgpack.Decoder(ClientRequest)
_encoder = msgspec.msgpack.Encoder()


def method_of(request: msgspec.Struct) -> str:
    return str(type(request).__struct_config__.tag)


def _rekey(key: str | None, run_id: str) -> str | None:
    if key is None:
        return None
    suffix = f"~{run_id}"
    if len(key) + len(suffix) > MAX_KEY:
        # Two long keys sharing a prefix must stay two keys.
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        key = key[: MAX_KEY - len(suffix) - len(digest) - 1] + "#" + digest
    return key + suffix


def _moved(deadline: str | None, shift_s: float) -> str | None:
    if deadline is None:
        return None
    try:
        return rfc3339(parse_rfc3339(deadline) + shift_s)
    except ValueError:
        return deadline  # core answers it as it answered the original


def fresh(request: Any, run_id: str, shift_s: float) -> Any:
    """``request`` as a new request of this run (see the module docstring)."""
    if isinstance(request, Invoke):
        d = request.directive
        directive = msgspec.structs.replace(
            d,
            directive_id=new_id(),
            directive_issued_at=rfc3339(),
            deadline_at=_moved(d.deadline_at, shift_s),
            idempotency_key=_rekey(d.idempotency_key, run_id),
            timing=msgspec.structs.replace(
                d.timing, deadline_at=_moved(d.timing.deadline_at, shift_s)
            ),
            signature=None,
            issuer_delegation=None,
        )
        return msgspec.structs.replace(request, request_id=new_id(), directive=directive)
    return msgspec.structs.replace(request, request_id=new_id())


def from_recording(
    fh: BinaryIO, speed: float, info: PlanInfo, started_wall: Callable[[], float]
) -> Iterator[Planned]:
    """The recording's requests at ``speed`` times their recorded pace, the first one
    due at once (the quiet before it is not replayed). ``started_wall`` gives the
    run's wall-clock start once it has one, for moving deadlines.

    The file is read lazily; the header is read (and checked) before the first
    request is due, so a file that is not a recording fails before anything is sent.
    """
    header, entries = read_recording(fh)
    recorded_at = parse_rfc3339(header.started_at)
    run_id = new_id()

    def plan() -> Iterator[Planned]:
        base: int | None = None
        for entry in entries:
            if base is None:
                base = entry.t_ns
            try:
                request = _decoder.decode(entry.request)
            except (msgspec.DecodeError, RecursionError):
                info.skipped += 1
                continue
            at_ns = int((entry.t_ns - base) / speed)
            # How far this request moves: from when it arrived to when it is now due.
            shift_s = (started_wall() + at_ns / 1e9) - (recorded_at + entry.t_ns / 1e9)
            req = fresh(request, run_id, shift_s)
            yield Planned(at_ns, _encoder.encode(req), req.request_id, method_of(req))

    return plan()


def synthetic(
    action_id: str,
    parameters: dict[str, Any],
    *,
    rate: float,
    duration_s: float,
    mode: TimingMode = "sync",
    timeout_ms: int | None = None,
) -> Iterator[Planned]:
    """``rate`` invokes of ``action_id`` a second, evenly spaced, for ``duration_s``."""
    count = int(rate * duration_s)
    interval_ns = 1e9 / rate
    issuer = Issuer(module_id=module_id(None, fallback=REPLAY_MODULE_ID))
    method = str(Invoke.__struct_config__.tag)
    for i in range(count):
        rid = new_id()
        req = Invoke(
            request_id=rid,
            directive=new_directive(
                action_id,
                parameters,
                issuer=issuer,
                mode=mode,
                timeout_ms=timeout_ms if timeout_ms is not None else DEFAULT_TIMEOUT_MS,
            ),
        )
        yield Planned(int(i * interval_ns), _encoder.encode(req), rid, method)
