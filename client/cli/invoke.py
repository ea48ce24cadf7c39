"""Run an action and print its outcome.

  sensorium invoke demo.fs.stat --param path=/etc/hostname
  sensorium invoke demo.fs.read-head --params-json '{"path": "/etc/os-release", "lines": 3}'

``--param k=v`` values are typed by the action's parameters_schema (integer,
number, boolean); ``--param k:=JSON`` passes a JSON value as is. Exit status: 0
completed, 1 failed or timed out, 2 refused before running.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from sensorium.client.api import Client
from sensorium.client.cli.terminal import printable
from sensorium.client.errors import ParametersInvalid


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
    parser.add_argument("--json", action="store_true", help="print the whole outcome as JSON")


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
    with Client(state_dir=args.state_dir) as client:
        params = parse_params(args, client)
        outcome = client.invoke(
            args.action_id, params, timeout_ms=args.timeout_ms, idempotency_key=args.idempotency_key
        )
    if args.json:
        print(msgspec.json.encode(outcome).decode())
        return 0 if outcome.ok else 1
    out = sys.stdout
    code = "-" if outcome.exit_code is None else outcome.exit_code
    out.write(
        f"{outcome.status} · exit {code} · {outcome.duration_ms:.1f} ms · "
        f"receipt outcome:{outcome.outcome_id}\n"
    )
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
    return 0 if outcome.ok else 1
