"""Deferred operations: list, show, poll now, cancel, wait.

  sensorium ops list [--open] [--limit N] [--json]   newest first
  sensorium ops show ID [--json]                     every registry field, redacted
  sensorium ops poll ID                              ask the connector now
  sensorium ops cancel ID                            cancel (or say why it cannot be)
  sensorium ops wait ID [--timeout S] [--json]       until it ends

list, show, poll and cancel read the host registry file directly, so they work
while core, the poller or the connector is down: poll then marks the operation
due for the poller, and cancel records the cancel that the poller delivers to the
connector once both answer. show never prints a result or a flow's context: a
result's status, exit code and digest; a continuation's keys and digest.
Exit status: 0 done, 1 unknown id, not cancelable, or the operation did not end well.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec

from sensorium.client.api import Client
from sensorium.client.cli.invoke import (
    UNTIL_EXPIRY,
    final_ok,
    in_words,
    print_final,
    seconds,
    wait_and_print,
)
from sensorium.client.cli.opsdetail import detail, result_summary, status_text
from sensorium.client.cli.terminal import printable
from sensorium.client.endpoint import core_endpoint
from sensorium.client.errors import NotCancelable
from sensorium.core.operations import summary_of
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import load_node_config
from sensorium.shared.deferred import polling
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.registry import Operation, Registry
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.wire.deferred import DeferredOperationStatus, OperationList

# How long the CLI waits to reach core before falling back to the registry.
CORE_CONNECT_S = 1.0
DIAGNOSTIC_COLUMN = 60


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="ops_command", required=True, metavar="SUBCOMMAND")
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state-dir", default=argparse.SUPPRESS, help="state directory")
    ls = sub.add_parser("list", parents=[state], help="operations, newest first")
    ls.add_argument("--open", action="store_true", help="only pending and running ones")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    show = sub.add_parser("show", parents=[state], help="one operation, every field (redacted)")
    show.add_argument("operation_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print the detail as JSON")
    poll = sub.add_parser("poll", parents=[state], help="ask the connector about it now")
    poll.add_argument("operation_id", metavar="ID")
    cancel = sub.add_parser("cancel", parents=[state], help="cancel it, or say why it cannot be")
    cancel.add_argument("operation_id", metavar="ID")
    wait = sub.add_parser("wait", parents=[state], help="wait until it ends (needs core)")
    wait.add_argument("operation_id", metavar="ID")
    wait.add_argument(
        "--timeout", type=seconds, metavar="S", help="give up after S seconds (default: its expiry)"
    )
    wait.add_argument("--json", action="store_true", help="print the final status as JSON")


def run(args: argparse.Namespace) -> int:
    if args.ops_command == "wait":
        return _wait(args)
    paths = StatePaths(resolve_state_dir(args.state_dir))
    registry = open_registry(paths)
    if registry is None:
        if args.ops_command == "list":
            print("no deferred operations on this node yet")
            return 0
        return _unknown(args.operation_id)
    try:
        handler = {"list": _list, "show": _show, "poll": _poll, "cancel": _cancel}
        return handler[args.ops_command](args, registry)
    finally:
        registry.close()


def open_registry(paths: StatePaths) -> Registry | None:
    """The host registry, read in place (``None`` when this node never made one)."""
    if not paths.registry_db.exists():
        return None
    policy = DeferredHostPolicy.from_config(load_node_config(paths).deferred)
    return Registry(paths.registry_db, policy)


def core_client(state_dir: str | None) -> Client | None:
    """A client for core, or ``None`` when its ipc socket is not even there."""
    endpoint = core_endpoint(None, state_dir)
    if endpoint.startswith("ipc://") and not Path(endpoint[len("ipc://") :]).exists():
        return None
    return Client(endpoint, state_dir=state_dir, connect_timeout_s=CORE_CONNECT_S)


def _unknown(operation_id: str) -> int:
    raise CodedError(
        RuntimeErrorCode.OPERATION_UNKNOWN,
        f"no deferred operation {operation_id[:140]!r} on this node; "
        "`sensorium ops list` shows the ones it has",
    )


# -- list -------------------------------------------------------------------


def when(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    delta = ts - now
    if abs(delta) < 1:
        return "now"
    return f"in {in_words(delta)}" if delta > 0 else f"{in_words(-delta)} ago"


def _diagnostic(op: Operation) -> str:
    text = f"{op.last_code}: {op.last_diagnostic or ''}" if op.last_code else op.last_diagnostic
    if not text:
        return "-"
    text = " ".join(text.split())
    return text if len(text) <= DIAGNOSTIC_COLUMN else text[: DIAGNOSTIC_COLUMN - 1] + "…"


def _list(args: argparse.Namespace, registry: Registry) -> int:
    ops = registry.recent(max(1, args.limit), open_only=args.open)
    if args.json:
        print(msgspec.json.encode(OperationList(operations=[summary_of(o) for o in ops])).decode())
        return 0
    if not ops:
        print("no open deferred operations" if args.open else "no deferred operations")
        return 0
    now = time.time()
    tty = sys.stdout.isatty()
    header = ("ID", "OWNER", "ACTION", "CREATED", "EXPIRES", "NEXT POLL", "ATTEMPTS", "STATUS")
    rows = [
        (
            o.operation_id,
            o.owner_module_id,
            o.action_id or o.capability_id,
            when(o.created_at, now),
            when(o.expires_at, now),
            when(o.next_poll_at, now),
            str(o.attempts),
            status_text(o, now),
        )
        for o in ops
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + "  LAST DIAGNOSTIC")
    for o, r in zip(ops, rows, strict=True):
        cells = "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
        print(printable(f"{cells}  {_diagnostic(o)}", tty))
    return 0


# -- show -------------------------------------------------------------------


def _show(args: argparse.Namespace, registry: Registry) -> int:
    op = registry.get(args.operation_id)
    if op is None:
        return _unknown(args.operation_id)
    now = time.time()
    view = detail(registry, op, now)
    if args.json:
        print(msgspec.json.encode(view).decode())
        return 0
    tty = sys.stdout.isatty()
    times = {"created_at", "updated_at", "expires_at", "deadline_at", "next_poll_at"}
    view["status"] = view.pop("status_note")
    for key, value in view.items():
        if key in ("last_diagnostic", "attempt_notes", "result", "continuation"):
            continue
        if value is None:
            continue
        if key in times:
            stamp = rfc3339(getattr(op, key))
            value = f"{stamp} ({when(getattr(op, key), now)})"
        print(printable(f"{key + ':':<28}{value}", tty))
    last = view["last_diagnostic"]
    if last is not None:
        print(printable(f"{'last_diagnostic:':<28}{last['code'] or '-'}: {last['message']}", tty))
        print(f"{'':<28}message {last['digest']}")
    for note in view["attempt_notes"]:
        line = f"{note['at']} after attempt {note['after_attempt']}: {note['code']}"
        print(printable(f"{'unanswered poll:':<28}{line}", tty))
    result = view["result"]
    if result is not None:
        parts = [f"{k} {result[k]}" for k in ("status", "exit_code", "outcome/id") if k in result]
        print(printable(f"{'result:':<28}{' · '.join(parts) or 'stored'}", tty))
        print(f"{'':<28}{result['bytes']} bytes, {result['digest']} (payload not shown)")
    cont = view["continuation"]
    if cont is not None:
        print("continuation (redacted):")
        for key, value in cont.items():
            if key == "context_keys":
                value = ", ".join(value) + " (values not shown)" if value else "(empty)"
            elif isinstance(value, dict):
                value = " ".join(f"{k}={v}" for k, v in value.items())
            print(printable(f"  {key + ':':<26}{'-' if value is None else value}", tty))
    if op.open:
        how = (
            f"`sensorium ops cancel {op.operation_id}`"
            if op.cancel_href is not None
            else "not cancelable"
        )
        print(f"poll now: `sensorium ops poll {op.operation_id}` · cancel: {how}")
    return 0


# -- poll -------------------------------------------------------------------


def _brief(op: Operation, now: float) -> str:
    text = f"{status_text(op, now)}, {op.attempts} polls"
    if op.next_poll_at is not None:
        text += f", next poll {when(op.next_poll_at, now)}"
    return text


def _poll(args: argparse.Namespace, registry: Registry) -> int:
    op = registry.get(args.operation_id)
    if op is None:
        return _unknown(args.operation_id)
    now = time.time()
    if not op.open:
        print(f"{op.operation_id} already ended: {_brief(op, now)}")
        if op.last_code or op.last_diagnostic:
            print(printable(f"  {_diagnostic(op)}", sys.stdout.isatty()))
        return 0
    answer: DeferredOperationStatus | CodedError
    client = core_client(args.state_dir)
    try:
        if client is None:
            raise CodedError(RuntimeErrorCode.CORE_UNAVAILABLE, "core's socket is not there")
        # Recorded below (a flow may resume with it): the raw outcome, not its summary.
        answer = client.status(op.operation_id, refresh=True, include_result=True)
    except CodedError as exc:  # the client's errors are CodedErrors too
        answer = exc
    finally:
        if client is not None:
            client.close()
    if isinstance(answer, CodedError) and answer.code == RuntimeErrorCode.CORE_UNAVAILABLE:
        after = registry.poke(op.operation_id, time.time())
        print(
            f"core is not running: {op.operation_id} is marked due; the poller polls it as soon "
            f"as it runs and core answers ({_brief(after, time.time())})"
        )
        return 0
    before = _brief(op, now)
    settled = polling.apply(
        registry,
        registry.get(op.operation_id) or op,
        None,
        answer,
        time.time(),
        load_node_config(StatePaths(resolve_state_dir(args.state_dir))).deferred.final_poll_grace_s,
    )
    after_op = settled.operation
    now = time.time()
    if isinstance(answer, CodedError):
        print(
            printable(
                f"no answer from the connector ({answer.code}: {answer.message[:200]}); not "
                f"counted as a poll: {_brief(after_op, now)}",
                sys.stdout.isatty(),
            )
        )
        return 0
    if not settled.changed:
        print(f"{op.operation_id}: recorded elsewhere first; now {_brief(after_op, now)}")
        return 0
    print(f"{op.operation_id}: {before} → {_brief(after_op, now)}")
    if not after_op.open:
        if after_op.last_code or after_op.last_diagnostic:
            print(printable(f"  {_diagnostic(after_op)}", sys.stdout.isatty()))
        result = result_summary(after_op.result)
        if result is not None:
            parts = [f"{k} {result[k]}" for k in ("status", "exit_code") if k in result]
            print(f"  result: {' · '.join(parts) or 'stored'} ({result['digest']})")
        if settled.resumed_flow:
            print(f"  resumed flow {settled.resumed_flow}")
    return 0


# -- cancel -----------------------------------------------------------------


def _cancel(args: argparse.Namespace, registry: Registry) -> int:
    op = registry.get(args.operation_id)
    if op is None:
        return _unknown(args.operation_id)
    tty = sys.stdout.isatty()
    if op.cancel_unavailable_reason is not None:
        print(
            printable(f"{op.operation_id} cannot be cancelled: {op.cancel_unavailable_reason}", tty)
        )
        return 1
    if not op.open:
        print(f"{op.operation_id} already ended {op.status}; nothing to cancel")
        return 0 if op.status == "cancelled" else 1
    client = core_client(args.state_dir)
    try:
        if client is None:
            raise CodedError(RuntimeErrorCode.CORE_UNAVAILABLE, "core's socket is not there")
        status = client.cancel(op.operation_id)
    except NotCancelable as exc:
        print(printable(exc.message, tty))
        return 1
    except CodedError as exc:
        if exc.code != RuntimeErrorCode.CORE_UNAVAILABLE:
            raise
        return _cancel_offline(registry, op.operation_id)
    finally:
        if client is not None:
            client.close()
    if status.status != "cancelled":
        print(f"{op.operation_id} ended {status.status} before the cancel; nothing cancelled")
        return 1
    now_op = registry.get(op.operation_id)
    if now_op is not None and now_op.connector_cancel == "owed":
        print(
            f"cancelled {op.operation_id}; the connector could not be told yet: the poller "
            "delivers the cancel when it answers"
        )
    else:
        print(f"cancelled {op.operation_id}; the connector's job was told to stop")
    return 0


def _cancel_offline(registry: Registry, operation_id: str) -> int:
    try:
        settled = registry.cancel(operation_id, time.time())
    except CodedError as exc:
        print(printable(exc.message, sys.stdout.isatty()))
        return 1
    if not settled.changed:
        print(f"{operation_id} already ended {settled.operation.status}; nothing to cancel")
        return 0 if settled.operation.status == "cancelled" else 1
    owed = settled.operation.connector_cancel == "owed"
    print(
        f"cancelled {operation_id} in the registry (core is not running)"
        + (
            "; the connector's job is owed a cancel, which the poller delivers when core and "
            "the connector answer"
            if owed
            else ""
        )
    )
    return 0


# -- wait -------------------------------------------------------------------


def _wait(args: argparse.Namespace) -> int:
    with Client(state_dir=args.state_dir) as client:
        # The operator's own tool: the outcome itself, as a sync invoke prints it.
        first = client.status(args.operation_id, include_result=True)
        if first.terminal:
            if args.json:
                print(msgspec.json.encode(first).decode())
                return 0 if final_ok(first) else 1
            return print_final(first)
        wait = args.timeout if args.timeout is not None else UNTIL_EXPIRY
        expires = first.expires_at if isinstance(first.expires_at, str) else None
        return wait_and_print(client, first.operation_id, wait, expires, args.json)
