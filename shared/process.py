"""What every Sensorium process does the same way: parse --state-dir, set up, serve, stop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable

import structlog

from sensorium.shared import logs
from sensorium.shared.config import ConfigError, NodeConfig, load_node_config
from sensorium.shared.paths import StatePathError, StatePaths, resolve_state_dir
from sensorium.shared.prctl import PR_SET_PDEATHSIG, prctl
from sensorium.shared.sdnotify import Notifier

EXIT_CONFIG = 78  # EX_CONFIG: systemd and the supervisor see a configuration error
# Set by the supervisor for its children: they die with it, never outlive it as orphans.
SUPERVISOR_PID_ENV = "SENSORIUM_SUPERVISOR_PID"


def follow_supervisor() -> None:
    """Under Sensorium's supervisor, get SIGTERM the moment it dies (however it dies)."""
    expected = os.environ.pop(SUPERVISOR_PID_ENV, None)
    if not expected:
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    # It may have died before prctl took effect: then nobody will signal us.
    if os.getppid() != int(expected):
        os.kill(os.getpid(), signal.SIGTERM)


def parse_common(prog: str, description: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--state-dir",
        help="state directory (default: $SENSORIUM_STATE_DIR, else ~/.local/state/sensorium)",
    )
    return parser.parse_args(argv)


def run_service(
    process: str,
    state_dir: str | None,
    main: Callable[[StatePaths, NodeConfig, asyncio.Event], Awaitable[None]],
) -> int:
    """Set up paths, config and logs; run ``main`` until SIGTERM/SIGINT sets its stop event."""
    try:
        paths = StatePaths(resolve_state_dir(state_dir))
        paths.ensure()
        cfg = load_node_config(paths)
    except (ConfigError, StatePathError, OSError) as exc:
        print(f"{process}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logs.configure(process, paths.logs)
    follow_supervisor()

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(paths, cfg, stop)

    try:
        asyncio.run(runner())
    except StatePathError as exc:
        structlog.get_logger().error("process.config.invalid", error=str(exc))
        return EXIT_CONFIG
    except Exception:
        structlog.get_logger().exception("process.crashed")
        return 1
    return 0


async def keep_alive(notifier: Notifier, stop: asyncio.Event) -> None:
    """Ping the watchdog from the event loop until ``stop``: a wedged loop stops the pings."""
    interval = notifier.watchdog_s / 2 if notifier.watchdog_s else None
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if interval:
            notifier.watchdog()
