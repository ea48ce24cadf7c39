"""Running the supervisor in the foreground, as ``sensorium up`` does.

SIGTERM and SIGINT stop it. SIGHUP reopens the logs (its own and, passed on, its
children's) — unless it is the hangup of the terminal ``up`` runs on, which stops it
as before (and ``nohup`` keeps it running).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable

from sensorium.shared import logs
from sensorium.shared.config import ConfigError, core_endpoint, load_node_config
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePathError, StatePaths, resolve_state_dir
from sensorium.shared.process import (
    EXIT_CONFIG,
    EXIT_STORAGE,
    check_state_dir,
    install_loop_logging,
)
from sensorium.shared.rpc.curve import check_endpoints
from sensorium.shared.store import storage_error
from sensorium.supervisor.control import run
from sensorium.supervisor.service import AlreadyRunning, Supervisor


def _terminal_watch() -> Callable[[], bool]:
    """A check for "the terminal we started on has hung up": a standard stream that was a
    TTY no longer is (a hung-up terminal answers EIO). Never true under ``nohup``, or
    without a terminal (systemd), where every SIGHUP means "reopen the logs"."""
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return lambda: False
    ttys = [fd for fd in (0, 1, 2) if os.isatty(fd)]
    return lambda: bool(ttys) and not any(os.isatty(fd) for fd in ttys)


def _reopen_logs(_sig: int, _frame: object) -> None:
    logs.reopen()


def run_foreground(state_dir: str | None, *, quiet: bool = False) -> int:
    hung_up = _terminal_watch()
    # Until the event loop takes SIGHUP over: a log rotation must not kill us.
    signal.signal(signal.SIGHUP, _reopen_logs)
    try:
        paths = StatePaths(resolve_state_dir(state_dir))
        # A read-only state directory stops `up` here, before any process is spawned.
        check_state_dir(paths)
        cfg = load_node_config(paths)
        check_endpoints(cfg, paths)
        endpoint = core_endpoint(cfg, paths)
    except CodedError as exc:
        print(f"sensorium: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_STORAGE if exc.code == RuntimeErrorCode.STORAGE_UNAVAILABLE else EXIT_CONFIG
    except (ConfigError, StatePathError, OSError) as exc:
        print(f"sensorium: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logs.configure("supervisor", paths.logs, cfg.logs)

    def announce(sup: Supervisor) -> None:
        if quiet:
            return
        pids = ", ".join(f"{c.name} {c.pid}" for c in sup.children.values())
        print(
            f"Sensorium is up ({pids}).\n"
            f"  state:  {paths.root}\n  client: {endpoint}\n"
            "  try:    sensorium actions   ·   sensorium invoke demo.system.uptime\n"
            "  stop:   Ctrl-C",
            flush=True,
        )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        install_loop_logging(loop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(paths, cfg, stop, announce, hung_up)

    try:
        asyncio.run(main())
    except AlreadyRunning as exc:
        print(f"sensorium: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        coded = storage_error(exc, paths.root)
        if coded is None:
            raise
        print(f"sensorium: {coded.code}: {coded.message}", file=sys.stderr)
        return EXIT_STORAGE
    return 0
