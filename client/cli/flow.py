"""Flows: run a sensorium-flow.v1 document, follow where it is.

  sensorium flow run FILE [--context JSON] [--json]    FILE may be - for stdin
  sensorium flow status ID [--json]
  sensorium flow wait ID [--timeout S] [--json]

Core runs the steps until one defers; the flow then waits, suspended, on that
operation (`sensorium ops show` tells about it) and resumes by itself when it
completes. The context's values are printed only with --json.
Exit status: 0 completed, running or suspended, 1 failed, 2 refused before running.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from sensorium.client.api import Client
from sensorium.client.cli.invoke import print_handle, seconds
from sensorium.client.cli.terminal import printable
from sensorium.client.errors import FlowInvalid
from sensorium.shared.config import load_node_config
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.wire.flow import FlowStatus

MAX_FLOW_BYTES = 1024 * 1024


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="flow_command", required=True, metavar="SUBCOMMAND")
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state-dir", default=argparse.SUPPRESS, help="state directory")
    run_p = sub.add_parser(
        "run", parents=[state], help="start a flow from a sensorium-flow.v1 file"
    )
    run_p.add_argument("file", metavar="FILE", help="the flow document (- reads stdin)")
    run_p.add_argument("--context", metavar="JSON", help="the flow's initial context (an object)")
    run_p.add_argument("--correlation-id", help="carried on every step's directive")
    run_p.add_argument("--json", action="store_true", help="print the flow status as JSON")
    status = sub.add_parser("status", parents=[state], help="where a flow is")
    status.add_argument("flow_id", metavar="ID")
    status.add_argument("--json", action="store_true", help="print the flow status as JSON")
    wait = sub.add_parser("wait", parents=[state], help="wait until a flow completes or fails")
    wait.add_argument("flow_id", metavar="ID")
    wait.add_argument(
        "--timeout",
        type=seconds,
        metavar="S",
        help="give up after S seconds (default: the host's maximum operation lifetime)",
    )
    wait.add_argument("--json", action="store_true", help="print the flow status as JSON")


def run(args: argparse.Namespace) -> int:
    handler = {"run": _run, "status": _status, "wait": _wait}[args.flow_command]
    return handler(args)


def _invalid(message: str, path: str = "$.flow") -> FlowInvalid:
    return FlowInvalid(RuntimeErrorCode.FLOW_INVALID, message, path=path)


def read_document(file: str) -> Any:
    """The JSON in FILE (or stdin for ``-``); ``FlowInvalid`` when it is not JSON."""
    try:
        raw = sys.stdin.buffer.read(MAX_FLOW_BYTES + 1) if file == "-" else Path(file).read_bytes()
    except OSError as exc:
        raise _invalid(f"cannot read {file}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FLOW_BYTES:
        raise _invalid(f"{file} is over {MAX_FLOW_BYTES} bytes; a flow is a short document")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _invalid(f"{file} is not JSON: {exc}") from None


def parse_context(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(f"--context is not JSON: {exc}", "$.context") from None
    if not isinstance(value, dict):
        raise _invalid("--context must be a JSON object", "$.context")
    return value


def _run(args: argparse.Namespace) -> int:
    document = read_document(args.file)
    context = parse_context(args.context)
    with Client(state_dir=args.state_dir) as client:
        status = client.run_flow(document, context, correlation_id=args.correlation_id)
    return _print(status, args.json)


def _status(args: argparse.Namespace) -> int:
    with Client(state_dir=args.state_dir) as client:
        status = client.flow_status(args.flow_id)
    return _print(status, args.json)


def _wait(args: argparse.Namespace) -> int:
    timeout = args.timeout
    if timeout is None:
        paths = StatePaths(resolve_state_dir(args.state_dir))
        timeout = load_node_config(paths).deferred.max_ttl_s
    with Client(state_dir=args.state_dir) as client:
        status = client.wait_flow(args.flow_id, timeout)
    return _print(status, args.json)


def _print(status: FlowStatus, as_json: bool) -> int:
    code = 1 if status.state == "failed" else 0
    if as_json:
        print(msgspec.json.encode(status).decode())
        return code
    tty = sys.stdout.isatty()
    if status.state == "completed":
        where = f"all {status.steps} steps done"
    else:
        where = f"at step {min(status.step_index + 1, status.steps)} of {status.steps}"
    print(f"flow {status.flow_id} · {status.state} · {where} · updated {status.updated_at}")
    print(f"  template {status.template_id}")
    keys = ", ".join(sorted(status.context)) or "(empty)"
    print(printable(f"  context keys: {keys} (--json shows the values)", tty))
    for d in status.diagnostics:
        print(printable(f"  {d.code}: {d.message}", tty))
    if status.deferred is not None:
        print("  waiting on:")
        print_handle(status.deferred, indent="    ")
    elif status.state == "suspended":
        print("  waiting on a deferred operation: `sensorium ops list --open` shows it")
    return code
