"""Running the supervisor in the foreground, as ``sensorium up`` does."""

from __future__ import annotations

import asyncio
import signal
import sys

from sensorium.shared import logs
from sensorium.shared.config import ConfigError, core_endpoint, load_node_config
from sensorium.shared.paths import StatePathError, StatePaths, resolve_state_dir
from sensorium.shared.process import EXIT_CONFIG
from sensorium.supervisor.service import AlreadyRunning, Supervisor, run


def run_foreground(state_dir: str | None, *, quiet: bool = False) -> int:
    try:
        paths = StatePaths(resolve_state_dir(state_dir))
        paths.ensure()
        cfg = load_node_config(paths)
        endpoint = core_endpoint(cfg, paths)
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
    return 0
