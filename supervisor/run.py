"""Running the supervisor in the foreground, as ``sensorium up`` does."""

from __future__ import annotations

import asyncio
import signal
import sys

from sensorium.shared import logs
from sensorium.shared.config import ConfigError, core_endpoint, load_node_config
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePathError, StatePaths, resolve_state_dir
from sensorium.shared.process import EXIT_CONFIG, EXIT_STORAGE, check_state_dir
from sensorium.shared.rpc.curve import check_endpoints
from sensorium.shared.store import storage_error
from sensorium.supervisor.service import AlreadyRunning, Supervisor, run


def run_foreground(state_dir: str | None, *, quiet: bool = False) -> int:
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
    logs.configure("supervisor", paths.logs)

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
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        await run(paths, cfg, stop, announce)

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
