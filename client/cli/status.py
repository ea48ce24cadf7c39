"""Show each supervised process: state, pid, uptime, restarts, memory.

Exit status 0 when every process is ready, 1 otherwise, 3 when no supervisor runs.
"""

from __future__ import annotations

import argparse

from sensorium.shared.config import load_node_config, supervisor_endpoint
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.supervisor_api import (
    Ack,
    SupervisorRestart,
    SupervisorResume,
    SupervisorStatus,
    SupervisorStatusReply,
    SupervisorStop,
)

RESUME_HELP = "Restart a process the supervisor marked failed (after its restart burst)."
STOP_HELP = "Stop the supervisor and every process it runs."
RESTART_HELP = "Restart one process (to load an edited, re-signed catalog, say); not a failure."


def _client(state_dir: str | None) -> SyncRpcClient:
    paths = StatePaths(resolve_state_dir(state_dir))
    return SyncRpcClient(
        supervisor_endpoint(load_node_config(paths), paths),
        name="supervisor",
        connect_timeout_s=1.0,
    )


def _mib(n: int | None) -> str:
    return f"{n / 1048576:.1f} MiB" if n else "-"


def _uptime(s: float | None) -> str:
    if s is None:
        return "-"
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the raw status as JSON")


def run(args: argparse.Namespace) -> int:
    import msgspec

    try:
        with _client(args.state_dir) as client:
            reply = client.call(SupervisorStatus(request_id=new_id()), SupervisorStatusReply, 5.0)
    except CodedError as exc:
        print(f"sensorium: no supervisor answers ({exc.code}); start one with `sensorium up`")
        return 3
    if args.json:
        print(msgspec.json.encode(reply).decode())
    else:
        print(f"supervisor pid {reply.pid}, up since {reply.started_at}, state {reply.state_dir}")
        print(
            f"{'PROCESS':<10} {'STATE':<9} {'PID':>7} {'UPTIME':>8} {'RESTARTS':>8} "
            f"{'RSS':>10}  LAST EXIT / STATUS"
        )
        for c in reply.children:
            note = c.last_exit or c.status_text or ""
            print(
                f"{c.name:<10} {c.state:<9} {c.pid or '-':>7} {_uptime(c.uptime_s):>8} "
                f"{c.restarts:>8} {_mib(c.rss_bytes):>10}  {note}"
            )
    return 0 if all(c.state == "ready" for c in reply.children) else 1


def configure_resume(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("process", choices=["core", "connector", "poller"])


def run_resume(args: argparse.Namespace) -> int:
    with _client(args.state_dir) as client:
        ack = client.call(SupervisorResume(request_id=new_id(), process=args.process), Ack, 5.0)
    print(ack.message)
    return 0 if ack.ok else 1


def configure_stop(parser: argparse.ArgumentParser) -> None:
    pass


def run_stop(args: argparse.Namespace) -> int:
    with _client(args.state_dir) as client:
        ack = client.call(SupervisorStop(request_id=new_id()), Ack, 5.0)
    print(ack.message)
    return 0


def configure_restart(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("process", choices=["core", "connector", "poller"])


def run_restart(args: argparse.Namespace) -> int:
    with _client(args.state_dir) as client:
        ack = client.call(SupervisorRestart(request_id=new_id(), process=args.process), Ack, 5.0)
    print(ack.message)
    return 0 if ack.ok else 1
