"""Record client requests with their arrival times, for ``sensorium replay``.

  sensorium record start [--name NAME] [--max-requests N] [--max-bytes N] [--duration S]
  sensorium record status
  sensorium record stop            # prints the file to replay

The file is ``<state>/recordings/NAME.srec`` (``sensorium-recording.v1``, 0600: it
holds every caller's parameters). A recording stops by itself at the node's
``record`` bounds or the ones given here, whichever is tighter.
"""

from __future__ import annotations

import argparse
import json

import msgspec

from sensorium.client import Client
from sensorium.shared.wire.client_api import RecordingStatus


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="record_command", required=True, metavar="start|stop|status")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", default=argparse.SUPPRESS, help="state directory")
    common.add_argument("--json", action="store_true", help="print the status as JSON")
    start = sub.add_parser("start", parents=[common], help="start recording")
    start.add_argument("--name", help="file name under <state>/recordings/ (default: the time)")
    start.add_argument("--max-requests", type=int, help="stop after this many requests")
    start.add_argument("--max-bytes", type=int, help="stop before the file passes this size")
    start.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    for name in ("stop", "status"):
        sub.add_parser(name, parents=[common], help=f"{name} the recording")


def _print(status: RecordingStatus, as_json: bool) -> None:
    if as_json:
        print(json.dumps(msgspec.to_builtins(status), indent=2))
        return
    if status.path is None:
        print("no recording since core started")
        return
    state = "recording" if status.active else f"stopped ({status.stopped_reason})"
    print(f"{state} · {status.requests} requests · {status.bytes} bytes · {status.path}")
    limits = f"  bounds: {status.max_requests} requests, {status.max_bytes} bytes"
    if status.max_duration_s is not None:
        limits += f", {status.max_duration_s:g} s"
    print(limits)
    if not status.active:
        print(f"  replay it: sensorium replay {status.path}")


def run(args: argparse.Namespace) -> int:
    with Client(state_dir=args.state_dir) as client:
        if args.record_command == "start":
            status = client.record_start(
                args.name,
                max_requests=args.max_requests,
                max_bytes=args.max_bytes,
                max_duration_s=args.duration,
            )
        elif args.record_command == "stop":
            status = client.record_stop()
        else:
            status = client.record_status()
    _print(status, args.json)
    return 0
