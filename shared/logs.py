"""Structured logs: one JSON object a line in ``logs/<process>.jsonl``, readable on a TTY.

Every line carries ``ts``, ``level``, ``process`` and ``event``, plus ``request/id``
where a request is being served (bound through contextvars by the RPC layer).
Lines are written whole with one ``write`` on an ``O_APPEND`` descriptor under a
lock, so threads never interleave or cut a line.

Size rotation (``logs.max_bytes``, ``logs.keep``): before a line would take the file
past ``max_bytes`` it becomes ``.jsonl.1`` (older ones shift up, the one past
``keep`` is deleted) and the line starts a fresh file. External rotation (logrotate
with ``create``) is served by ``reopen``: SIGHUP calls it, and the next line opens
the path anew; lines written meanwhile land in the moved file, none are lost.

Under systemd (``JOURNAL_STREAM`` names our stderr) each line also goes to stderr as
JSON behind a ``<N>`` syslog priority, which journald reads as the entry's level.

Logging never takes a process down: a line that cannot be written (disk full,
read-only state directory) is dropped and counted, a line the disk filled in the
middle of is taken back, and the first line written again is preceded by a
``log.dropped`` line saying how many were lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, TextIO

import msgspec
import structlog

from sensorium.shared.config import LogConfig

LEVEL_ENV = "SENSORIUM_LOG_LEVEL"
_configured = False
_json = msgspec.json.Encoder(enc_hook=str)
# Bumped by ``reopen`` (from a signal handler: no I/O there); each sink compares.
_reopen_generation = 0
_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC  # read: see _open
# syslog priorities for journald's SyslogLevelPrefix= (on by default).
_PRIORITY = {"critical": 2, "error": 3, "exception": 3, "warning": 4, "info": 6, "debug": 7}
_RETRY_S = 1.0  # a failed reopen is tried again at most this often


def reopen() -> None:
    """Have every sink open its path again before its next line (what SIGHUP means).

    Safe inside a signal handler: it only bumps a counter."""
    global _reopen_generation
    _reopen_generation += 1


def journal_stream() -> bool:
    """True when stderr is the systemd journal stream ``JOURNAL_STREAM`` names (dev:ino),
    not a file or pipe it was redirected to since."""
    want = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(part) for part in want.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class _LineSink:
    """Appends each rendered event as one line (rotating by size, reopening on request);
    mirrors it readably to a TTY, or as prioritised JSON to the journal."""

    def __init__(
        self,
        path: Path | None,
        console: bool,
        *,
        max_bytes: int = 0,
        keep: int = 5,
        journal: bool = False,
    ) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._keep = keep
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        # Past this size the file rotates; raised after a failed rotation, so a directory
        # that refuses renames is not asked again for every line.
        self._limit = max_bytes
        self._generation = _reopen_generation
        self._retry_at = 0.0
        # Lines lost since the last one written, and why the last was lost.
        self.dropped = 0
        self._why: str | None = None
        self._note: dict[str, Any] | None = None  # a rotation problem to report in-line
        if path is not None:
            self._fd = self._open()
        self._journal = journal
        self._console = (
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
            if console and not journal
            else None
        )

    def __call__(self, _logger: Any, _name: str, event: MutableMapping[str, Any]) -> str:
        encoded = _json.encode(event)
        if self._path is not None:
            with self._lock:
                self._append(encoded + b"\n", event)
        if self._journal:
            prio = _PRIORITY.get(str(event.get("level")), 6)
            return f"<{prio}>" + encoded.decode("utf-8", "replace")
        if self._console is None:
            raise structlog.DropEvent
        shown = {k: v for k, v in event.items() if k not in ("process",)}
        return str(self._console(_logger, _name, shown))

    # -- the file ---------------------------------------------------------

    def _open(self) -> int | None:
        assert self._path is not None
        try:
            fd = os.open(self._path, _FLAGS, 0o640)
        except OSError as exc:  # a read-only state directory: log nowhere, run on
            self._why = f"cannot open {self._path}: {exc.strerror}"
            return None
        try:
            self._size = os.fstat(fd).st_size
            # A writer killed mid-line left a fragment: end it, so that our first line
            # starts a line of its own instead of gluing onto it.
            if self._size and os.pread(fd, 1, self._size - 1) != b"\n":
                self._size += os.write(fd, b"\n")
        except OSError:
            self._size = 0
        self._limit = self._max_bytes
        return fd

    def _reopen(self) -> None:
        """Open the path again (logrotate moved the file); on failure keep writing where we
        were — a moved file still takes lines — and try again a little later."""
        now = time.monotonic()
        if now < self._retry_at:
            return
        # Read before opening: a SIGHUP that lands while we open must reopen again.
        generation = _reopen_generation
        fd = self._open()
        if fd is None:
            self._retry_at = now + _RETRY_S
            return
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._generation = generation

    def _numbered(self, n: int) -> Path:
        assert self._path is not None
        return self._path.with_name(f"{self._path.name}.{n}")

    def _rotate(self, event: MutableMapping[str, Any]) -> None:
        """``<p>.jsonl`` → ``.1`` (``.1`` → ``.2`` …, the one past ``keep`` deleted), then a
        fresh ``<p>.jsonl``. The fresh file is made first, under a side name, so a
        directory that takes no new file leaves everything as it was."""
        assert self._path is not None and self._fd is not None
        fresh = self._path.with_name(self._path.name + ".next")
        try:
            fd = os.open(fresh, _FLAGS | os.O_TRUNC, 0o640)
        except OSError as exc:
            self._rotation_failed(event, exc)
            return
        try:
            for old in self._path.parent.glob(self._path.name + ".*"):
                suffix = old.name[len(self._path.name) + 1 :]
                if suffix.isdigit() and int(suffix) > self._keep:  # from a larger ``keep``
                    old.unlink(missing_ok=True)
            for n in range(self._keep - 1, 0, -1):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(self._numbered(n), self._numbered(n + 1))
            os.rename(self._path, self._numbered(1))
            os.rename(fresh, self._path)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(fresh)
            self._rotation_failed(event, exc)
            return
        os.close(self._fd)
        self._fd, self._size, self._limit = fd, 0, self._max_bytes

    def _rotation_failed(self, event: MutableMapping[str, Any], exc: OSError) -> None:
        self._limit = self._size + self._max_bytes
        self._note = {
            "ts": event.get("ts"),
            "level": "warning",
            "process": event.get("process"),
            "event": "log.rotate.failed",
            "error": f"{exc.filename or self._path}: {exc.strerror or exc}",
        }

    def _append(self, line: bytes, event: MutableMapping[str, Any]) -> None:
        if self._generation != _reopen_generation:
            self._reopen()
        if self._fd is None:
            self.dropped += 1
            return
        if self.dropped:
            note = {
                "ts": event.get("ts"),
                "level": "warning",
                "process": event.get("process"),
                "event": "log.dropped",
                "dropped": self.dropped,
                "reason": self._why,
            }
            line = _json.encode(note) + b"\n" + line
        if self._limit and self._size and self._size + len(line) > self._limit:
            # Someone may have truncated the file under us (copytruncate): ask it.
            with contextlib.suppress(OSError):
                self._size = os.fstat(self._fd).st_size
            if self._size and self._size + len(line) > self._limit:
                self._rotate(event)
        if self._note is not None:
            line = _json.encode(self._note) + b"\n" + line
            self._note = None
        try:
            written = os.write(self._fd, line)
        except OSError as exc:
            self._lost(exc.strerror or str(exc))
            return
        if written < len(line):
            # The disk filled in mid-line: take the fragment back, so every line in the
            # file stays one whole JSON object.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            self._lost(f"short write ({written} of {len(line)} bytes)")
            return
        self._size += written
        self.dropped = 0
        self._why = None

    def _lost(self, why: str) -> None:
        self.dropped += 1
        self._why = why


class _StderrLogger:
    """structlog's PrintLogger, except that a stderr that cannot be written (a closed
    terminal, a full disk under it) loses the line instead of raising into the caller."""

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def msg(self, message: str) -> None:
        try:
            self._file.write(message + "\n")
            self._file.flush()
        except (OSError, ValueError):
            pass

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


def _drop(*_args: Any, **_kw: Any) -> None:
    return None


class LibraryLogger:
    """A logger for code that also runs inside other people's programs (the client's RPC
    layer): it speaks only in a process that called ``configure``, never on an embedder's
    stdout.
    """

    def __init__(self, name: str) -> None:
        self._inner = structlog.get_logger(name)

    def __getattr__(self, method: str) -> Any:
        return getattr(self._inner, method) if _configured else _drop


def configure(
    process: str,
    log_dir: Path | None,
    cfg: LogConfig | None = None,
    *,
    console: bool | None = None,
) -> None:
    """Set up structlog for this process: ``logs/<process>.jsonl`` rotated per ``cfg``,
    plus stderr — JSON for the journal under systemd, else readable when ``console``
    (default: stderr is a TTY)."""
    cfg = cfg or LogConfig()
    if log_dir is not None:
        with contextlib.suppress(OSError):  # then the sink drops and counts every line
            log_dir.mkdir(parents=True, exist_ok=True)
    level_name = os.environ.get(LEVEL_ENV, "info").upper()
    level = getattr(logging, level_name, logging.INFO)
    show = sys.stderr.isatty() if console is None else console
    sink = _LineSink(
        log_dir / f"{process}.jsonl" if log_dir is not None else None,
        show,
        max_bytes=cfg.max_bytes,
        keep=cfg.keep,
        journal=journal_stream(),
    )

    def add_process(_l: Any, _n: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event.setdefault("process", process)
        return event

    global _configured
    _configured = True
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            add_process,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            sink,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *_args: _StderrLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )
