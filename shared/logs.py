"""Structured logs: one JSON object a line in ``logs/<process>.jsonl``, readable on a TTY.

Every line carries ``ts``, ``level``, ``process`` and ``event``, plus ``request/id``
where a request is being served (bound through contextvars by the RPC layer).
Lines are written whole with one ``write`` on an ``O_APPEND`` descriptor, so
concurrent writers never interleave or cut a line.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import msgspec
import structlog

LEVEL_ENV = "SENSORIUM_LOG_LEVEL"
_configured = False
_json = msgspec.json.Encoder(enc_hook=str)


class _LineSink:
    """Appends each rendered event as one line; mirrors it readably to a TTY."""

    def __init__(self, path: Path | None, console: bool) -> None:
        self._fd = (
            os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            if path is not None
            else None
        )
        self._console = (
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()) if console else None
        )

    def __call__(self, _logger: Any, _name: str, event: MutableMapping[str, Any]) -> str:
        if self._fd is not None:
            os.write(self._fd, _json.encode(event) + b"\n")
        if self._console is None:
            raise structlog.DropEvent
        shown = {k: v for k, v in event.items() if k not in ("process",)}
        return str(self._console(_logger, _name, shown))


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
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
