"""Send recorded or synthetic load at core, open loop, and report what came back.

  sensorium replay FILE [--speed 2]                  # a recording at twice its pace
  sensorium replay --synthetic demo.system.uptime --rate 500 --duration 10
  sensorium replay FILE --concurrency 8 --json > report.json

Requests go out when they are due whether or not earlier ones were answered.
Latency runs from when each request was due (p50/p90/p99/p99.9 from an HDR
histogram); errors are counted by diagnostic code. A live progress line goes to
stderr. Replayed requests get fresh ids; idempotency keys are suffixed per run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace

import msgspec

from sensorium.client import Client
from sensorium.client.cli.invoke import parse_params
from sensorium.client.replay import ReplayReport, replay_recording, replay_synthetic
from sensorium.client.replay.report import Tally, progress_line, render_text
from sensorium.shared.rpc.curve import ClientKeys

NON_TTY_PROGRESS_S = 5.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", help="a recording (`sensorium record stop` names it)")
    parser.add_argument("--speed", type=float, default=1.0, help="pace multiplier (default 1)")
    parser.add_argument("--synthetic", metavar="ACTION", help="invoke ACTION instead of a file")
    parser.add_argument("--rate", type=float, help="with --synthetic: requests per second")
    parser.add_argument("--duration", type=float, metavar="S", help="with --synthetic: seconds")
    parser.add_argument("--param", "-p", action="append", default=[], metavar="K=V")
    parser.add_argument("--params-json", metavar="JSON")
    parser.add_argument("--timeout-ms", type=int, help="with --synthetic: the action timeout")
    parser.add_argument(
        "--async", dest="deferred", action="store_true", help="with --synthetic: run deferred"
    )
    parser.add_argument("--concurrency", "-c", type=int, default=4, help="connections (4)")
    parser.add_argument(
        "--max-in-flight", type=int, default=10_000, help="outstanding requests at most (10000)"
    )
    parser.add_argument(
        "--reply-timeout", type=float, default=30.0, metavar="S", help="count as reply-timeout"
    )
    parser.add_argument("--endpoint", help="core's endpoint (default: from the state directory)")
    parser.add_argument("--curve-key", metavar="FILE", help="a client key for a tcp endpoint")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--report", metavar="FILE", help="also write the JSON report here")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress line")
    parser.add_argument("--fail-on-error", action="store_true", help="exit 1 if any error")


class _Progress:
    """A line rewritten in place on a terminal; a plain line every 5 s otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.width = 0

    def __call__(self, elapsed_s: float, tally: Tally, inflight: int) -> None:
        line = progress_line(elapsed_s, tally, inflight)
        if self.tty:
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = len(line)
        elif time.monotonic() - self.last >= NON_TTY_PROGRESS_S:
            sys.stderr.write(line + "\n")
            self.last = time.monotonic()
        sys.stderr.flush()

    def done(self) -> None:
        if self.tty and self.width:
            sys.stderr.write("\n")


def _usage(message: str) -> int:
    print(f"sensorium replay: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.synthetic is None):
        return _usage("give a recording FILE or --synthetic ACTION (one of them)")
    if args.synthetic and (args.rate is None or args.duration is None):
        return _usage("--synthetic needs --rate N and --duration S")
    if args.concurrency < 1 or args.max_in_flight < 1:
        return _usage("--concurrency and --max-in-flight must be at least 1")
    curve = ClientKeys.load(args.curve_key) if args.curve_key else None
    progress = None if args.quiet else _Progress()
    common = dict(
        endpoint=args.endpoint,
        state_dir=args.state_dir,
        curve=curve,
        concurrency=args.concurrency,
        max_inflight=args.max_in_flight,
        reply_timeout_s=args.reply_timeout,
        progress=progress,
    )
    try:
        if args.synthetic:
            params = {}
            if args.param or args.params_json:
                with Client(args.endpoint, state_dir=args.state_dir, curve=curve) as client:
                    ns = SimpleNamespace(
                        action_id=args.synthetic, param=args.param, params_json=args.params_json
                    )
                    params = parse_params(ns, client)  # type: ignore[arg-type]
            report: ReplayReport = replay_synthetic(
                args.synthetic,
                params,
                rate=args.rate,
                duration_s=args.duration,
                mode="async" if args.deferred else "sync",
                timeout_ms=args.timeout_ms,
                **common,
            )
        else:
            report = replay_recording(args.file, speed=args.speed, **common)
    finally:
        if progress is not None:
            progress.done()
    doc = msgspec.to_builtins(report)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    print(json.dumps(doc, indent=2) if args.json else render_text(report))
    return 1 if args.fail_on_error and report.errors else 0
