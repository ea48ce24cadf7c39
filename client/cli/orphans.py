"""Show the orphan-event queue and quarantine (reads the audit store directly).

sensorium orphans [--state queued|recovered|quarantined] [--json]
sensorium orphans show ORPHAN_ID
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=argparse.SUPPRESS, help="state directory")


def run(args: argparse.Namespace) -> int:
    return 0
