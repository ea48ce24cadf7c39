"""Merge the processes' JSON logs by time and print them; ``-f`` follows.

sensorium logs -f --process core --level warning
sensorium logs --request-id 01J... --json
sensorium logs --since 10m --event directive.

Reads ``logs/<process>.jsonl`` and its rotated ``.jsonl.1`` … files, oldest first;
following survives size rotation and logrotate's move-and-reopen (SIGHUP), never
printing a line twice or skipping one. What a process printed outside its log (a
crash, say) is in ``logs/<process>.stderr``, not shown here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
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
_CHUNK = 1 << 16
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ROTATED = re.compile(r"(.+\.jsonl)\.(\d+)")
# Looks at a log's files before taking what it saw, when rotations keep moving them.
SCAN_TRIES = 20


def _since(text: str) -> str:
    """``10m``/``2h``/``30s``/``1d`` ago, or an ISO time (local when it names no zone),
    as a timestamp comparable with the logs' ``ts``."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    try:
        if m:
            at = datetime.now(UTC) - timedelta(seconds=float(m[1]) * _UNITS[m[2]])
        else:
            at = datetime.fromisoformat(text.strip()).astimezone(UTC)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: say how long ago (10m, 2h, 30s, 1d) or when (2025-01-31T14:00)"
        ) from None
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    parser.add_argument(
        "-n",
        "--lines",
        type=int,
        default=200,
        help="how many of the latest matching lines to print first (0: none)",
    )
    parser.add_argument("--process", action="append", help="only this process (repeatable)")
    parser.add_argument("--level", choices=list(LEVELS), help="this level and above")
    parser.add_argument("--event", help="only events starting with this")
    parser.add_argument("--request-id", help="only lines of this request/id")
    parser.add_argument("--action", help="only lines about this action_id")
    parser.add_argument(
        "--since", type=_since, help="only lines since then: 10m, 2h, 1d ago, or an ISO time"
    )
    parser.add_argument("--json", action="store_true", help="print raw JSON lines")


def _ts_key(ts: str) -> str:
    """``ts`` sortable as text: isoformat leaves out a zero fraction (``…:05Z``)."""
    if len(ts) > 19 and ts[19] != ".":
        return f"{ts[:19]}.000000{ts[19:]}"
    return ts


class _Matcher:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.since: str | None = args.since
        # Cheap byte tests first: most lines of a busy log are not the one request.
        self._needles = [s.encode() for s in (args.request_id, args.action) if s]

    def __call__(self, raw: bytes) -> tuple[str, dict[str, Any]] | None:
        if not all(n in raw for n in self._needles):
            return None
        parsed = parse(raw)
        if parsed is None or not _matches(parsed[1], self.args):
            return None
        return parsed


def parse(raw: bytes) -> tuple[str, dict[str, Any]] | None:
    """A line's sortable ``ts`` and its object; None for a line torn by a killed writer."""
    try:
        ev = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(ev, dict):
        return None
    return _ts_key(str(ev.get("ts", ""))), ev


def _matches(ev: dict[str, Any], args: argparse.Namespace) -> bool:
    if args.process and ev.get("process") not in args.process:
        return False
    if args.level and LEVELS.get(str(ev.get("level")), 0) < LEVELS[args.level]:
        return False
    if args.event and not str(ev.get("event", "")).startswith(args.event):
        return False
    if args.request_id and ev.get("request/id") != args.request_id:
        return False
    if args.since and _ts_key(str(ev.get("ts", ""))) < args.since:
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


# -- reading ----------------------------------------------------------------


class _File:
    """One open log file, read from where we stopped; whole lines only."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd = fd
        self.offset = offset
        self.partial = b""
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)

    @classmethod
    def open(cls, path: Path) -> _File | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        return cls(fd, 0)

    def read(self) -> list[bytes]:
        try:
            if os.fstat(self.fd).st_size < self.offset:  # truncated (copytruncate)
                self.offset, self.partial = 0, b""
            chunks = []
            while data := os.pread(self.fd, _CHUNK * 16, self.offset):
                self.offset += len(data)
                chunks.append(data)
        except OSError:
            return []
        if not chunks:
            return []
        lines = (self.partial + b"".join(chunks)).split(b"\n")
        self.partial = lines.pop()
        return [ln for ln in lines if ln]

    def close(self) -> None:
        os.close(self.fd)


def _ident(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _whole_end(fd: int, size: int) -> int:
    """Where the last whole line of the first ``size`` bytes ends (a line still being
    written is left for the follower)."""
    pos = size
    while pos > 0:
        start = max(0, pos - _CHUNK)
        cut = os.pread(fd, pos - start, start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        pos = start
    return 0


def _backward(fd: int, end: int) -> Iterator[bytes]:
    """The lines of the first ``end`` bytes (ending with a newline), newest first."""
    pos, head = end, b""
    while pos > 0:
        start = max(0, pos - _CHUNK)
        lines = (os.pread(fd, pos - start, start) + head).split(b"\n")
        head = lines[0]
        yield from (ln for ln in reversed(lines[1:]) if ln)
        pos = start
    if head:
        yield head


class _Log:
    """One process's log across rotations: the file its path names now, plus files moved
    away from it that a writer which has not reopened yet may still add to. A newer file
    with lines means the writer left the older ones for good: they are read out and
    closed, so the old file's last lines always come before the new file's first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files: list[_File] = []  # oldest first; the last may be the current one

    def backlog(self, match: _Matcher, want: int) -> list[tuple[str, dict[str, Any], bytes]]:
        """Up to ``want`` latest matching lines (rotated files too), oldest first; the
        files stay open, positioned for following from there."""
        current, files = self._scan()
        found: list[tuple[str, dict[str, Any], bytes]] = []
        done = want == 0
        for f in files:  # newest first
            try:
                f.offset = _whole_end(f.fd, os.fstat(f.fd).st_size)
                for raw in () if done else _backward(f.fd, f.offset):
                    if match.since is not None:
                        parsed = parse(raw)
                        if parsed is not None and parsed[0] < match.since:
                            done = True  # a file is in time order: the rest is older
                            break
                    hit = match(raw)
                    if hit is not None:
                        found.append((hit[0], hit[1], raw))
                        done = len(found) >= want
                        if done:
                            break
            except OSError:
                continue
        # Followed: the current file, and the newest rotated one, which a writer that has
        # not reopened yet (logrotate, then SIGHUP) may still add to.
        keep = files[:2] if current is not None else files[:1]
        for f in files[len(keep) :]:
            f.close()
        self.files = keep[::-1]
        found.reverse()
        return found

    def _scan(self) -> tuple[_File | None, list[_File]]:
        """The current file and the rotated ones, newest first. A rotation while we
        open them shifts every name up, and the oldest file would sit at a name we did
        not list: then the names no longer show what we opened, and we look again."""
        for tries_left in range(SCAN_TRIES - 1, -1, -1):
            current = _File.open(self.path)
            files: list[_File] = [] if current is None else [current]
            opened: list[tuple[Path, tuple[int, int] | None]] = [
                (self.path, None if current is None else current.ident)
            ]
            for _n, p in sorted(self._numbered()):
                f = _File.open(p)
                opened.append((p, None if f is None else f.ident))
                if f is None:
                    continue
                if any(f.ident == g.ident for g in files):  # rotated while we looked
                    f.close()
                    continue
                files.append(f)
            names = {self.path, *(p for _n, p in self._numbered())}
            still = names == {p for p, _i in opened} and all(_ident(p) == i for p, i in opened)
            if still or not tries_left:  # the last look is taken as it is
                return current, files
            for f in files:
                f.close()
        raise AssertionError("unreachable")

    def _numbered(self) -> list[tuple[int, Path]]:
        numbered: list[tuple[int, Path]] = []
        for p in self.path.parent.glob(self.path.name + ".*"):
            m = _ROTATED.fullmatch(p.name)
            if m and m[1] == self.path.name:
                numbered.append((int(m[2]), p))
        return numbered

    def _switch(self) -> None:
        """The path names another file: follow it, and pick up the files rotated past
        since we looked (several rotations between two polls): they sit between ours and
        the new one at ``.1``, ``.2`` … Names only shift up while we scan, so a file may
        be met twice (skipped by identity), never missed."""
        current = _File.open(self.path)
        if current is None:
            return
        known = {f.ident for f in self.files} | {current.ident}
        between: list[_File] = []
        found = not self.files
        n = 1
        while not found:
            f = _File.open(self.path.with_name(f"{self.path.name}.{n}"))
            if f is None:
                break
            if f.ident == self.files[-1].ident:
                found = True
            if f.ident in known:
                f.close()
            else:
                known.add(f.ident)
                between.append(f)
            n += 1
        if not found:  # ours was moved out of the numbering (logrotate's dateext, say)
            for f in between:
                f.close()
            between = []
        self.files += [*reversed(between), current]

    def poll(self) -> list[bytes]:
        try:
            st = os.stat(self.path)
            ident: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:  # between a rotation's two renames
            ident = None
        if ident is not None and (not self.files or self.files[-1].ident != ident):
            self._switch()
        got: list[list[bytes]] = []
        newest_used = -1
        for i in range(len(self.files) - 1, -1, -1):  # newest first: see the comment above
            f = self.files[i]
            got.append(f.read())
            if newest_used < 0 and (f.offset > 0 or got[-1]):
                newest_used = i
        got.reverse()
        out = [ln for batch in got for ln in batch]
        if newest_used > 0:
            for f in self.files[:newest_used]:
                f.close()
            del self.files[:newest_used]
        return out


def _logs(logdir: Path, known: dict[Path, _Log]) -> list[_Log]:
    """The logs not yet known: ``<p>.jsonl``, or only rotated ones of it."""
    fresh = []
    for p in logdir.glob("*.jsonl*"):
        m = _ROTATED.fullmatch(p.name)
        path = logdir / m[1] if m else p
        if path.name.endswith(".jsonl") and path not in known:
            known[path] = _Log(path)
            fresh.append(known[path])
    return fresh


def run(args: argparse.Namespace) -> int:
    logdir = StatePaths(resolve_state_dir(args.state_dir)).logs
    color = sys.stdout.isatty() and not args.json
    match = _Matcher(args)
    known: dict[Path, _Log] = {}
    want = max(args.lines, 0)
    first = [hit for log in _logs(logdir, known) for hit in log.backlog(match, want)]
    first.sort(key=lambda item: item[0])
    for _ts, ev, raw in first[-want:] if want else []:
        print(_render(ev, raw, args.json, color))
    sys.stdout.flush()
    while args.follow:
        time.sleep(FOLLOW_INTERVAL_S)
        _logs(logdir, known)  # a process that started logging after us: from its start
        batch = []
        for log in known.values():
            for raw in log.poll():
                hit = match(raw)
                if hit is not None:
                    batch.append((hit[0], hit[1], raw))
        batch.sort(key=lambda item: item[0])
        for _ts, ev, raw in batch:
            print(_render(ev, raw, args.json, color))
        sys.stdout.flush()
    return 0
