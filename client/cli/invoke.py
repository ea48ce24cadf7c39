"""Run an action and print its outcome.

  sensorium invoke demo.fs.stat --param path=/etc/hostname
  sensorium invoke demo.fs.read-head --params-json '{"path": "/etc/os-release", "lines": 3}'
  sensorium invoke demo.fs.find-large --param path=/usr --param min_mib=50 --async
                                                         print the operation's handle
  sensorium invoke demo.fs.find-large --param path=/usr --param min_mib=50 --async --wait 120
                                                         wait, print the final outcome

Directives name ``issuer.module_id`` ``$SENSORIUM_MODULE_ID`` (default
``sensorium.cli``): a claim, which nothing over ipc authenticates.

``--param k=v`` values are typed by the action's parameters_schema (integer,
number, boolean); ``--param k:=JSON`` passes a JSON value as is. ``--async``
needs an action whose catalog entry allows it (execution_mode_support ``either``
or ``async-only``); ``--wait`` without SECONDS waits until the operation expires.
Exit status: 0 completed (or accepted, with --async alone), 1 failed, timed out,
cancelled, expired, or still running at the --wait deadline, 2 refused before
running.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import msgspec

from sensorium.client.api import Client
from sensorium.client.cli.terminal import printable
from sensorium.client.cli.usage import usage_line
from sensorium.client.endpoint import module_id
from sensorium.client.errors import DeadlineExceeded, ParametersInvalid
from sensorium.shared.clock import parse_rfc3339
from sensorium.shared.explanations import hint
from sensorium.shared.wire.declaration import SENSITIVITY_CLASSES
from sensorium.shared.wire.deferred import DeferredOperation, DeferredOperationStatus
from sensorium.shared.wire.outcome import Accounting, Outcome

# The issuer.module_id of the CLI's directives unless $SENSORIUM_MODULE_ID names one.
CLI_MODULE_ID = "sensorium.cli"


def cli_module_id() -> str:
    return module_id(None, fallback=CLI_MODULE_ID)


# --wait without SECONDS: until the operation's expiry, and a little past it, so the
# host's `expired` is what ends the wait rather than the CLI's own clock.
UNTIL_EXPIRY = -1.0
EXPIRY_GRACE_S = 5.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action_id")
    parser.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        metavar="K=V",
        help="a parameter; repeat for more (K:=JSON for a JSON value)",
    )
    parser.add_argument("--params-json", metavar="JSON", help="all parameters as one JSON object")
    parser.add_argument("--timeout-ms", type=int, help="action timeout (clamped to its maximum)")
    parser.add_argument("--idempotency-key", help="retries with the same key never spawn twice")
    parser.add_argument(
        "--consent",
        choices=SENSITIVITY_CLASSES,
        metavar="CLASS",
        help="consent explicitly to run an action up to this sensitivity class "
        "(needed above the node's consent.max_sensitivity_without_consent)",
    )
    parser.add_argument(
        "--async",
        dest="deferred",
        action="store_true",
        help="run deferred: print the operation's handle at once",
    )
    parser.add_argument(
        "--wait",
        nargs="?",
        const=UNTIL_EXPIRY,
        type=seconds,
        metavar="SECONDS",
        help="with --async: wait for the final status (default: until the operation expires)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the whole outcome (or handle, or status) as JSON"
    )


def _coerce(raw: str, schema: dict[str, Any] | None) -> Any:
    kind = (schema or {}).get("type")
    try:
        if kind == "integer":
            return int(raw)
        if kind == "number":
            return float(raw)
    except ValueError:
        return raw  # let core's validation name the problem and its path
    if kind == "boolean" and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


def parse_params(args: argparse.Namespace, client: Client) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if args.params_json:
        try:
            loaded = json.loads(args.params_json)
        except json.JSONDecodeError as exc:
            raise ParametersInvalid(
                "parameters-invalid", f"--params-json is not JSON: {exc}", path="$.parameters"
            ) from None
        if not isinstance(loaded, dict):
            raise ParametersInvalid(
                "parameters-invalid", "--params-json must be a JSON object", path="$.parameters"
            )
        params.update(loaded)
    if not args.param:
        return params
    props: dict[str, Any] = {}
    for action in client.describe().actions:
        if action.action_id == args.action_id:
            props = action.parameters_schema.get("properties", {}) or {}
    for item in args.param:
        if ":=" in item and item.index(":=") < item.index("=") + 1:
            key, raw = item.split(":=", 1)
            try:
                params[key] = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ParametersInvalid(
                    "parameters-invalid", f"{key}: not JSON: {exc}", path=f"$.parameters.{key}"
                ) from None
            continue
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ParametersInvalid(
                "parameters-invalid", f"--param {item!r}: write KEY=VALUE", path="$.parameters"
            )
        params[key] = _coerce(raw, props.get(key))
    return params


def run(args: argparse.Namespace) -> int:
    if args.wait is not None and not args.deferred:
        print("sensorium: --wait needs --async (a sync invoke already waits)", file=sys.stderr)
        return 2
    with Client(state_dir=args.state_dir, module_id=cli_module_id()) as client:
        params = parse_params(args, client)
        if args.deferred:
            op = client.invoke(
                args.action_id,
                params,
                mode="async",
                timeout_ms=args.timeout_ms,
                idempotency_key=args.idempotency_key,
                consent=args.consent,
            )
            if args.wait is None:
                if args.json:
                    print(msgspec.json.encode(op).decode())
                else:
                    print_handle(op)
                return 0
            if not args.json:
                print_handle(op)
                sys.stdout.flush()  # seen while the wait runs, even through a pipe
            return wait_and_print(client, op.operation_id, args.wait, op.expires_at, args.json)
        outcome = client.invoke(
            args.action_id,
            params,
            timeout_ms=args.timeout_ms,
            idempotency_key=args.idempotency_key,
            consent=args.consent,
        )
    if args.json:
        print(msgspec.json.encode(outcome).decode())
        return 0 if outcome.ok else 1
    return print_outcome(outcome)


def print_outcome(outcome: Outcome) -> int:
    """An outcome as the terminal shows it; the exit status it means."""
    out = sys.stdout
    code = "-" if outcome.exit_code is None else outcome.exit_code
    out.write(
        f"{outcome.status} · exit {code} · {outcome.duration_ms:.1f} ms · "
        f"receipt outcome:{outcome.outcome_id}\n"
    )
    if isinstance(outcome.accounting, Accounting):
        out.write(usage_line(outcome.accounting) + "\n")
    text = printable(outcome.stdout.text, out.isatty())
    if text:
        out.write(text if text.endswith("\n") else text + "\n")
    if outcome.stdout.truncated:
        out.write(
            f"[stdout truncated: {outcome.stdout.bytes_total} bytes produced, "
            f"{outcome.stdout.bytes_captured} kept]\n"
        )
    if outcome.stderr.text:
        sys.stderr.write(printable(outcome.stderr.text, sys.stderr.isatty()))
    if outcome.result is not None and outcome.result.pointers:
        out.write("pointers: " + json.dumps(outcome.result.pointers) + "\n")
    for d in outcome.diagnostics:
        out.write(printable(f"{d.code}: {d.message}\n", out.isatty()))
        if not outcome.ok and (see := hint(d.code)):
            out.write(see + "\n")
    return 0 if outcome.ok else 1


def in_words(seconds: float) -> str:
    """``4m05s``-style duration for people (never negative)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86_400}d{s % 86_400 // 3600:02d}h"


def print_handle(op: DeferredOperation, indent: str = "") -> None:
    """A deferred handle: its id, expiry, retry hint, and how to cancel it (or why not)."""
    tty = sys.stdout.isatty()
    left = _left(op.expires_at)
    receipt = "" if op.audit_outcome_ref is msgspec.UNSET else f" · receipt {op.audit_outcome_ref}"
    print(f"{indent}deferred · operation {op.operation_id}{receipt}")
    expiry = f"in {in_words(left)}" if left is not None else "?"
    print(f"{indent}  expires {op.expires_at} ({expiry}) · retry after {op.retry_after_seconds}s")
    if op.cancel_unavailable_reason is not msgspec.UNSET:
        print(printable(f"{indent}  not cancelable: {op.cancel_unavailable_reason}", tty))
        print(f"{indent}  follow: sensorium ops wait {op.operation_id}")
    else:
        print(f"{indent}  cancel_href: {op.cancel_href}")
        print(
            f"{indent}  follow: sensorium ops wait {op.operation_id} · "
            f"cancel: sensorium ops cancel {op.operation_id}"
        )


def final_ok(status: DeferredOperationStatus) -> bool:
    outcome = status.result_or_none
    return status.status == "completed" and (
        not isinstance(outcome, dict) or outcome.get("status", "completed") == "completed"
    )


def print_final(status: DeferredOperationStatus) -> int:
    """A final operation status like a sync outcome; the exit status it means."""
    polls = "" if status.attempt_no is None else f" · {status.attempt_no} polls"
    print(f"{status.status} · operation {status.operation_id}{polls}")
    tty = sys.stdout.isatty()
    for d in status.diagnostics:
        print(printable(f"{d.code}: {d.message}", tty))
    if (result := status.result_or_none) is not None:
        try:
            outcome = msgspec.convert(result, Outcome)
        except msgspec.ValidationError:
            print(printable("result: " + json.dumps(result), tty))
        else:
            print_outcome(outcome)
    return 0 if final_ok(status) else 1


def wait_and_print(
    client: Client, operation_id: str, wait: float, expires_at: str | None, as_json: bool
) -> int:
    """Wait for the final status and print it (``--json``: the status document, and the
    last one seen when the deadline passes first)."""
    try:
        final = client.wait(operation_id, wait_seconds(wait, expires_at), include_result=True)
    except DeadlineExceeded as exc:
        if as_json and exc.last is not None:
            print(msgspec.json.encode(exc.last).decode())
        raise
    if as_json:
        print(msgspec.json.encode(final).decode())
        return 0 if final_ok(final) else 1
    return print_final(final)


def seconds(text: str) -> float:
    """An argparse type: a number of seconds, not negative."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds cannot be negative")
    return value


def wait_seconds(wait: float, expires_at: str | None) -> float:
    """``--wait``'s deadline in seconds from now."""
    if wait != UNTIL_EXPIRY:
        return wait
    left = _left(expires_at)
    return (left if left is not None else 0.0) + EXPIRY_GRACE_S


def _left(timestamp: str | None) -> float | None:
    if timestamp is None:
        return None
    try:
        return parse_rfc3339(timestamp) - time.time()
    except ValueError:
        return None
