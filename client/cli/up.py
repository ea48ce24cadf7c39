"""Start core, the OS connector and the poller, and supervise them in the foreground.

Waits for READY=1 from each, restarts a crashed process with backoff, and stops
everything on Ctrl-C or SIGTERM. Logs go to <state>/logs/<process>.jsonl
(`sensorium logs -f` follows them).
"""

from __future__ import annotations

import argparse

from sensorium.supervisor.run import run_foreground


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="print nothing once up")


def run(args: argparse.Namespace) -> int:
    return run_foreground(args.state_dir, quiet=args.quiet)
