"""Merge the processes' JSON logs by time and print them; ``-f`` follows.

sensorium logs -f --process core --level warning
sensorium logs --request-id 01J... --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from sensorium.client.cli.terminal import printable
from sensorium.shared.paths import StatePaths, resolve_state_dir

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_COLORS = {
    "debug": "\033[2m",
    "info": "",
    "warning": "\033[33m",
    "error": "\033[31m",
    "critical": "\033[1;31m",
}
FOLLOW_INTERVAL_S = 0.25


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    parser.add_argument(
        "-n",
        "--lines",
        type=int,
        default=200,
        help="how many of the latest matching lines to print first",
    )
    parser.add_argument("--process", action="append", help="only this process (repeatable)")
    parser.add_argument("--level", choices=list(LEVELS), help="this level and above")
    parser.add_argument("--event", help="only events starting with this")
    parser.add_argument("--request-id", help="only lines of this request/id")
    parser.add_argument("--action", help="only lines about this action_id")
    parser.add_argument("--json", action="store_true", help="print raw JSON lines")


class _Tail:
    """Reads whole new lines from one file, remembering where it stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[bytes]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        return [ln for ln in lines if ln]


def _matches(ev: dict[str, Any], args: argparse.Namespace) -> bool:
    if args.process and ev.get("process") not in args.process:
        return False
    if args.level and LEVELS.get(str(ev.get("level")), 0) < LEVELS[args.level]:
        return False
    if args.event and not str(ev.get("event", "")).startswith(args.event):
        return False
    if args.request_id and ev.get("request/id") != args.request_id:
        return False
    return not (args.action and ev.get("action_id") != args.action)


def _render(ev: dict[str, Any], raw: bytes, as_json: bool, color: bool) -> str:
    if as_json:
        return raw.decode("utf-8", "replace")
    ts = str(ev.get("ts", ""))[11:23]
    level = str(ev.get("level", ""))
    rest = " ".join(
        f"{k}={v}"
        for k, v in ev.items()
        if k not in ("ts", "level", "process", "event", "exception")
    )
    line = f"{ts} {ev.get('process', '?'):<10} {level:<7} {ev.get('event', '')} {rest}"
    if "exception" in ev:
        line += "\n" + str(ev["exception"])
    line = printable(line, color)
    if color and _COLORS.get(level):
        line = f"{_COLORS[level]}{line}\033[0m"
    return line


def _collect(tails: dict[Path, _Tail], logdir: Path) -> list[tuple[str, dict[str, Any], bytes]]:
    for path in sorted(logdir.glob("*.jsonl")):
        tails.setdefault(path, _Tail(path))
    out = []
    for tail in tails.values():
        for raw in tail.read():
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if isinstance(ev, dict):
                out.append((str(ev.get("ts", "")), ev, raw))
    out.sort(key=lambda item: item[0])
    return out


def run(args: argparse.Namespace) -> int:
    logdir = StatePaths(resolve_state_dir(args.state_dir)).logs
    color = sys.stdout.isatty() and not args.json
    tails: dict[Path, _Tail] = {}
    first = [item for item in _collect(tails, logdir) if _matches(item[1], args)]
    for _ts, ev, raw in first[-args.lines :] if args.lines > 0 else []:
        print(_render(ev, raw, args.json, color))
    sys.stdout.flush()
    while args.follow:
        time.sleep(FOLLOW_INTERVAL_S)
        for _ts, ev, raw in _collect(tails, logdir):
            if _matches(ev, args):
                print(_render(ev, raw, args.json, color), flush=True)
    return 0
