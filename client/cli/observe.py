"""Follow the observations core publishes, one line each, until Ctrl-C.

sensorium observe
sensorium observe --kind sensorium.core/ --json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec
import zmq

from sensorium.client.cli.terminal import printable
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.rpc.sockets import (
    DEFAULT_HWM,
    DEFAULT_MAX_MESSAGE,
)
from sensorium.shared.rpc.sockets import (
    configure as configure_sock,
)
from sensorium.shared.wire.observation import Observation

POLL_MS = 250
SUMMARY_MAX = 200
_decoder = msgspec.msgpack.Decoder(Observation)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", default="", help="only signal/kind values starting with this")
    parser.add_argument("--json", action="store_true", help="print each observation as JSON")
    parser.add_argument(
        "-n", "--count", type=int, default=0, help="stop after this many (default: never)"
    )


def socket_path(state_dir: str | None) -> Path:
    return StatePaths(resolve_state_dir(state_dir)).run / "observations.sock"


def render(obs: Observation, as_json: bool, color: bool) -> str:
    if as_json:
        return msgspec.json.encode(obs).decode()
    summary = msgspec.json.encode(obs.summary).decode()
    if len(summary) > SUMMARY_MAX:
        summary = summary[: SUMMARY_MAX - 1] + "…"
    line = (
        f"{obs.observed_at[11:23]} {obs.signal_kind} {obs.source.action_id} "
        f"{obs.status} {obs.outcome_ref} {summary}"
    )
    return printable(line, color)


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
    path = socket_path(args.state_dir)
    if not path.exists():
        print(f"sensorium: no observation stream at {path} yet; waiting for core", file=sys.stderr)
    ctx = zmq.Context()
    sock: zmq.Socket[Any] = ctx.socket(zmq.SUB)
    configure_sock(sock, hwm=DEFAULT_HWM, max_message=2 * DEFAULT_MAX_MESSAGE)
    sock.setsockopt(zmq.SUBSCRIBE, args.kind.encode())
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
