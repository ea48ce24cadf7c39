"""Follow the observations core publishes, one line each, until Ctrl-C; or read stored ones.

sensorium observe
sensorium observe --kind sensorium.core/ --json
sensorium observe query --kind sensorium.demo/ --since 2026-05-05T00:00:00Z --limit 20
sensorium observe get OBSERVATION_ID

Following subscribes to the local topics ``local/sensorium/observations/{signal-kind}``
(``--kind`` is a prefix of the kind). ``query`` and ``get`` ask core
(``sensorium.observe.query``, ``sensorium.observation.get``): records kept until their
TTL, newest first, a bounded page at a time (``--cursor`` continues one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec
import zmq

from sensorium.client.api import Client
from sensorium.client.cli.terminal import printable
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.rpc.sockets import (
    DEFAULT_HWM,
    DEFAULT_MAX_MESSAGE,
)
from sensorium.shared.rpc.sockets import (
    configure as configure_sock,
)
from sensorium.shared.wire.declaration import SENSITIVITY_CLASSES
from sensorium.shared.wire.observation import TOPIC_PREFIX, Observation

POLL_MS = 250
SUMMARY_MAX = 200
_decoder = msgspec.msgpack.Decoder(Observation)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", default="", help="only signal/kind values starting with this")
    parser.add_argument("--json", action="store_true", help="print each observation as JSON")
    parser.add_argument(
        "-n", "--count", type=int, default=0, help="stop after this many (default: never)"
    )
    sub = parser.add_subparsers(dest="observe_command", metavar="{query,get}")
    q = sub.add_parser("query", help="stored observations, newest first, one bounded page")
    q.add_argument("--kind", default=argparse.SUPPRESS, help="signal/kind prefix")
    q.add_argument("--since", help="observed/at at or after this RFC 3339 time")
    q.add_argument("--until", help="observed/at before this RFC 3339 time")
    q.add_argument("--subject-kind")
    q.add_argument("--subject-id")
    q.add_argument("--connector", help="connector/id")
    q.add_argument("--directive", help="directive/id")
    q.add_argument("--sensitivity", action="append", choices=SENSITIVITY_CLASSES)
    q.add_argument("--limit", type=int, default=50)
    q.add_argument("--cursor", help="next/cursor of the previous page")
    q.add_argument("--asc", action="store_true", help="oldest first")
    q.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    g = sub.add_parser("get", help="one stored observation by id, as its JSON document")
    g.add_argument("observation_id", metavar="OBSERVATION_ID")


def socket_path(state_dir: str | None) -> Path:
    return StatePaths(resolve_state_dir(state_dir)).run / "observations.sock"


def render(obs: Observation, as_json: bool, color: bool) -> str:
    if as_json:
        return msgspec.json.encode(obs).decode()
    summary = msgspec.json.encode(obs.result_pointers).decode()
    if len(summary) > SUMMARY_MAX:
        summary = summary[: SUMMARY_MAX - 1] + "…"
    line = (
        f"{obs.observed_at[11:23]} {obs.signal_kind} {obs.action_id or '-'} "
        f"{obs.outcome_status or '-'} outcome:{obs.outcome_id or '-'} {summary}"
    )
    return printable(line, color)


def read_stored(args: argparse.Namespace) -> int:
    """``observe query`` / ``observe get``: ask core for what it keeps."""
    with Client(state_dir=args.state_dir) as client:
        if args.observe_command == "get":
            print(render(client.observation(args.observation_id), True, False))
            return 0
        page = client.observe_query(
            kind_prefix=args.kind or None,
            since=args.since,
            until=args.until,
            subject_kind=args.subject_kind,
            subject_id=args.subject_id,
            connector_id=args.connector,
            directive_id=args.directive,
            sensitivity=args.sensitivity,
            limit=args.limit,
            cursor=args.cursor,
            order="asc" if args.asc else "desc",
        )
    if args.json:
        print(msgspec.json.encode(page).decode())
        return 0
    color = sys.stdout.isatty()
    for obs in page.observations:
        print(render(obs, False, color))
    if page.next_cursor:
        print(f"more: --cursor {page.next_cursor}", file=sys.stderr)
    return 0


def follow(sock: zmq.Socket[Any], args: argparse.Namespace) -> None:
    color = sys.stdout.isatty() and not args.json
    seen = 0
    while args.count <= 0 or seen < args.count:
        if not sock.poll(POLL_MS):
            continue
        frames = sock.recv_multipart()
        try:
            obs = _decoder.decode(frames[-1])
        except msgspec.DecodeError as exc:
            print(f"sensorium: skipped an undecodable observation: {exc}", file=sys.stderr)
            continue
        print(render(obs, args.json, color), flush=True)
        seen += 1


# How long `observe` waits to report the subscription before following anyway.
CONNECT_WAIT_MS = 5000


def run(args: argparse.Namespace) -> int:
    if getattr(args, "observe_command", None) is not None:
        return read_stored(args)
    path = socket_path(args.state_dir)
    if not path.exists():
        print(f"sensorium: no observation stream at {path} yet; waiting for core", file=sys.stderr)
    ctx = zmq.Context()
    sock: zmq.Socket[Any] = ctx.socket(zmq.SUB)
    configure_sock(sock, hwm=DEFAULT_HWM, max_message=2 * DEFAULT_MAX_MESSAGE)
    sock.setsockopt(zmq.SUBSCRIBE, (TOPIC_PREFIX + args.kind).encode())
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sock.connect(f"ipc://{path}")
    try:
        # Say when the subscription is really in place (a script can wait for this
        # line rather than guess with a sleep); events sent before it are not seen.
        if monitor.poll(CONNECT_WAIT_MS):
            print(f"sensorium: following {path}", file=sys.stderr, flush=True)
        else:
            print(
                f"sensorium: {path} not reachable yet; it will be followed once core serves it",
                file=sys.stderr,
                flush=True,
            )
        sock.disable_monitor()
        monitor.close(linger=0)
        follow(sock, args)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close(linger=0)
        ctx.term()
    return 0
