"""What every Sensorium process does the same way: parse --state-dir, set up, serve, stop.

Signals: SIGTERM and SIGINT stop; SIGHUP reopens the log file (logrotate), never stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import signal
import stat
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from sensorium.shared import logs, rolelock
from sensorium.shared.config import ConfigError, NodeConfig, load_node_config
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePathError, StatePaths, resolve_state_dir
from sensorium.shared.prctl import PR_SET_PDEATHSIG, prctl
from sensorium.shared.rpc import server as rpc_server
from sensorium.shared.rpc.curve import check_endpoints
from sensorium.shared.sdnotify import Notifier
from sensorium.shared.store import storage_error

EXIT_CONFIG = 78  # EX_CONFIG: systemd and the supervisor see a configuration error
EXIT_STORAGE = 73  # EX_CANTCREAT: the state directory cannot be written
# What a state directory we may not write into says when we try.
_UNWRITABLE = (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM)
# Set by the supervisor for its children: they die with it, never outlive it as orphans.
SUPERVISOR_PID_ENV = "SENSORIUM_SUPERVISOR_PID"
# Set by the supervisor for a start it made early: the fd to wait on for its word.
HOLD_FD_ENV = "SENSORIUM_HOLD_FD"


def wait_for_word() -> int | None:
    """None to go on, else the exit code of a process that must not start.

    A restart's process is spawned while its backoff runs, so that its imports overlap
    the wait; it does nothing else until the supervisor writes its word, at the
    backoff's end. End of file instead (the supervisor stopped, or died) means: do not
    start (0). So does a hold fd that is not a pipe (EX_CONFIG): the supervisor then
    starts a process afresh."""
    held = os.environ.pop(HOLD_FD_ENV, None)
    if held is None:
        return None
    try:
        fd = int(held)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise ValueError(f"fd {fd} is not a pipe")
    except (ValueError, OSError) as exc:
        print(
            f"{HOLD_FD_ENV}={held!r} names no pipe from the supervisor ({exc}); not starting",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        return None if os.read(fd, 1) == b"1" else 0
    except OSError:
        return 0
    finally:
        os.close(fd)


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


def check_state_dir(paths: StatePaths) -> None:
    """Create the tree and prove that every directory a process writes into takes a new
    file, so a read-only state directory is one clear error at start, not a crash at
    the first write. Raises ``storage-unavailable`` naming the path; a full disk passes
    (its processes answer ``storage-unavailable`` per write until space is back)."""
    try:
        paths.ensure()
        for d in (paths.storage, paths.logs, paths.run, paths.connector_os, paths.artifacts):
            probe = d / f".probe-{os.getpid()}"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))
            os.unlink(probe)
    except OSError as exc:
        if exc.errno not in _UNWRITABLE:
            raise
        where = exc.filename or paths.root
        raise CodedError(
            RuntimeErrorCode.STORAGE_UNAVAILABLE,
            f"the state directory cannot be written: {where}: {exc.strerror}; nothing was "
            "started. Make it writable (or free space on its file system), or pass another "
            "--state-dir",
            detail={"path": str(where)},
        ) from None


def _reopen_logs(_sig: int, _frame: object) -> None:
    logs.reopen()


def _describe(exc: BaseException | None) -> str | None:
    return None if exc is None else f"{type(exc).__name__}: {exc!s:.300}"


def loop_exception(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's handler: one structured line per report, never a traceback on
    stderr (where nothing rotates it and a busy loop can write megabytes of them)."""
    exc = context.get("exception")
    structlog.get_logger("sensorium.asyncio").error(
        "asyncio.unhandled",
        message=str(context.get("message", ""))[:300],
        error=_describe(exc if isinstance(exc, BaseException) else None),
    )


class _ToStructlog(logging.Handler):
    """Python's own loggers (asyncio's warnings, say) as one structured line each."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            exc = record.exc_info[1] if record.exc_info else None
            structlog.get_logger(record.name).log(
                record.levelno,
                "python.log",
                logger=record.name,
                message=record.getMessage()[:500],
                error=_describe(exc),
            )
        except Exception:  # a log line must never take a process down
            self.handleError(record)


def install_loop_logging(loop: asyncio.AbstractEventLoop) -> None:
    """Route the loop's exception reports and Python's ``logging`` into our log."""
    loop.set_exception_handler(loop_exception)
    root = logging.getLogger()
    if not any(isinstance(h, _ToStructlog) for h in root.handlers):
        root.addHandler(_ToStructlog(logging.WARNING))


def run_service(
    process: str,
    state_dir: str | None,
    main: Callable[[StatePaths, NodeConfig, asyncio.Event], Awaitable[None]],
) -> int:
    """Set up paths, config and logs; run ``main`` until SIGTERM/SIGINT sets its stop event."""
    held = wait_for_word()
    if held is not None:
        return held
    # First, so that no SIGHUP (a log rotation) finds us with its default action, which
    # kills. A plain handler, not the loop's: it only bumps a counter, and it stays in
    # place after the event loop closes, when asyncio would restore the default.
    signal.signal(signal.SIGHUP, _reopen_logs)
    try:
        paths = StatePaths(resolve_state_dir(state_dir))
        check_state_dir(paths)
        rolelock.take(paths, process)
        cfg = load_node_config(paths)
        check_endpoints(cfg, paths)
    except rolelock.RoleTaken as exc:
        print(f"{process}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except CodedError as exc:
        print(f"{process}: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_STORAGE if exc.code == RuntimeErrorCode.STORAGE_UNAVAILABLE else EXIT_CONFIG
    except (ConfigError, StatePathError, OSError) as exc:
        print(f"{process}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logs.configure(process, paths.logs, cfg.logs)
    follow_supervisor()

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        install_loop_logging(loop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(paths, cfg, stop)

    try:
        asyncio.run(runner())
    except StatePathError as exc:
        structlog.get_logger().error("process.config.invalid", error=str(exc))
        return EXIT_CONFIG
    except Exception as exc:
        coded = storage_error(exc, paths.root)
        if coded is None:
            structlog.get_logger().exception("process.crashed")
            return 1
        # Not a bug: say what the operator can do, without a traceback.
        structlog.get_logger().error("process.storage.unavailable", error=coded.message)
        print(f"{process}: {coded.code}: {coded.message}", file=sys.stderr)
        return EXIT_STORAGE
    return 0


async def serving_problems(timeout_s: float) -> list[str]:
    """What keeps this process from serving: each RpcServer it bound checks that it
    still owns its socket and that its receive loop answers a probe (empty: healthy)."""
    problems = []
    for server in rpc_server.bound_servers():
        problem = await server.check(timeout_s)
        if problem is not None:
            problems.append(problem)
    return problems


async def keep_alive(notifier: Notifier, stop: asyncio.Event) -> None:
    """Ping the watchdog until ``stop``, and only while the process serves: each ping
    follows a health check of its serving path (its sockets are its own and its event
    loop answers a probe on them), so a wedged loop, or a socket lost or taken over,
    stops the pings and the supervisor (or systemd) restarts the process."""
    interval = notifier.watchdog_s / 2 if notifier.watchdog_s else None
    withheld = False
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if not interval or stop.is_set():
            continue
        problems = await serving_problems(max(0.2, min(interval / 2, 5.0)))
        if problems:
            structlog.get_logger().error("watchdog.ping.withheld", problems=problems)
            withheld = True
            continue
        if withheld:
            structlog.get_logger().info("watchdog.ping.resumed")
            withheld = False
        notifier.watchdog()
