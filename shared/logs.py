"""Structured logs: one JSON object a line in ``logs/<process>.jsonl``, readable on a TTY.

Every line carries ``ts``, ``level``, ``process`` and ``event``, plus ``request/id``
where a request is being served (bound through contextvars by the RPC layer).
Lines are written whole with one ``write`` on an ``O_APPEND`` descriptor, so
concurrent writers never interleave or cut a line.

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
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, TextIO

import msgspec
import structlog

LEVEL_ENV = "SENSORIUM_LOG_LEVEL"
_configured = False
_json = msgspec.json.Encoder(enc_hook=str)


class _LineSink:
    """Appends each rendered event as one line; mirrors it readably to a TTY."""

    def __init__(self, path: Path | None, console: bool) -> None:
        self._path = path
        self._fd: int | None = None
        # Lines lost since the last one written, and why the last was lost.
        self.dropped = 0
        self._why: str | None = None
        if path is not None:
            try:
                self._fd = os.open(
                    path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640
                )
            except OSError as exc:  # a read-only state directory: log nowhere, run on
                self._why = f"cannot open {path}: {exc.strerror}"
        self._console = (
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()) if console else None
        )

    def __call__(self, _logger: Any, _name: str, event: MutableMapping[str, Any]) -> str:
        if self._path is not None:
            self._append(_json.encode(event) + b"\n", event)
        if self._console is None:
            raise structlog.DropEvent
        shown = {k: v for k, v in event.items() if k not in ("process",)}
        return str(self._console(_logger, _name, shown))

    def _append(self, line: bytes, event: MutableMapping[str, Any]) -> None:
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


def configure(process: str, log_dir: Path | None, *, console: bool | None = None) -> None:
    """Set up structlog for this process. ``console`` defaults to "stderr is a TTY"."""
    if log_dir is not None:
        with contextlib.suppress(OSError):  # then the sink drops and counts every line
            log_dir.mkdir(parents=True, exist_ok=True)
    level_name = os.environ.get(LEVEL_ENV, "info").upper()
    level = getattr(logging, level_name, logging.INFO)
    show = sys.stderr.isatty() if console is None else console
    sink = _LineSink(log_dir / f"{process}.jsonl" if log_dir is not None else None, show)

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
