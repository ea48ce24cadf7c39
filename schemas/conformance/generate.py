"""Writes the conformance vectors beside this file: ``NAME.msgpack`` (the exact request
bytes) and ``NAME.json`` (the same request rendered as JSON, and what the reply must
hold). Run it after changing a case: ``python schemas/conformance/generate.py``.

Rendering of what JSON cannot say: ``{"$bin": BASE64}`` is MessagePack bin,
``{"$timestamp": RFC3339}`` the MessagePack timestamp extension (type -1), and a float
is written with its fraction (``5000.0``). ``"$raw": BASE64`` instead of ``request``
marks a body that is not MessagePack at all.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import msgspec

HERE = Path(__file__).resolve().parent
ISSUED = "2026-01-01T00:00:00Z"


def directive(n: int, **change: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "schema": "sensorium-directive.v1",
        "schema/v": 1,
        "directive/id": f"conformance-{n:02d}",
        "directive/issued_at": ISSUED,
        "issuer": {"module_id": "conformance.vectors"},
        "action_id": "demo.fs.stat",
        "parameters": {"path": "/"},
        "timing": {"mode": "sync", "timeout_ms": 5000},
    }
    d.update(change)
    return {k: v for k, v in d.items() if v is not _DROP}


_DROP = object()


def invoke(n: int, **change: Any) -> dict[str, Any]:
    return {
        "request/id": f"conformance-request-{n:02d}",
        "method": "sensorium.directive.invoke",
        "directive": directive(n, **change),
    }


def rejected(code: str, path: str | None = None) -> dict[str, Any]:
    diag: dict[str, Any] = {"code": code}
    if path:
        diag["path"] = path
    return {
        "ok": True,
        "result": {
            "schema": "sensorium-directive-result.v1",
            "status": "rejected",
            "diagnostics": [diag],
        },
    }


def malformed(path: str | None, code: str = "request-malformed") -> dict[str, Any]:
    error: dict[str, Any] = {"code": code}
    if path:
        error["path"] = path
    return {"ok": False, "error": error}


COMPLETED = {
    "ok": True,
    "result": {"schema": "sensorium-directive-result.v1", "status": "completed"},
}

CASES: list[tuple[str, str, Any, dict[str, Any]]] = [
    (
        "01-health",
        "health of the node; `version` says which Sensorium answers",
        {"request/id": "conformance-request-01", "method": "sensorium.health"},
        {"ok": True, "result": {"process": "core"}},
    ),
    (
        "02-directive-list",
        "the actions this caller may invoke, with parameter schemas",
        {"request/id": "conformance-request-02", "method": "sensorium.directive.list"},
        {"ok": True},
    ),
    ("03-invoke-completed", "a sync directive that runs", invoke(3), COMPLETED),
    (
        "04-invoke-unknown-action",
        "refused at admission: a rejected result",
        invoke(4, action_id="demo.nope"),
        rejected("action-not-allowlisted", "$.action_id"),
    ),
    (
        "05-invoke-invalid-parameters",
        "a parameter of the wrong type",
        invoke(5, parameters={"path": 7}),
        rejected("parameters-invalid"),
    ),
    (
        "06-integer-as-float",
        "5000.0 where an integer is expected is read as 5000",
        invoke(6, timing={"mode": "sync", "timeout_ms": 5000.0}),
        COMPLETED,
    ),
    (
        "07-timestamp-extension",
        "the MessagePack timestamp extension for issued_at",
        invoke(7, **{"directive/issued_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)}),
        COMPLETED,
    ),
    (
        "08-nil-optional",
        "nil for optional fields is read as absent",
        invoke(8, **{"correlation/id": None, "idempotency/key": None}),
        COMPLETED,
    ),
    (
        "09-bin-for-string",
        "bin where a string is expected is refused, with its location",
        invoke(9, action_id=b"demo.fs.stat"),
        malformed("$.directive.action_id"),
    ),
    (
        "10-fractional-integer",
        "a float with a fraction where an integer is expected",
        invoke(10, timing={"mode": "sync", "timeout_ms": 5000.5}),
        malformed("$.directive.timing.timeout_ms"),
    ),
    (
        "11-directive-missing",
        "an invoke without a directive",
        {"request/id": "conformance-request-11", "method": "sensorium.directive.invoke"},
        malformed("$.directive", "directive-missing"),
    ),
    (
        "12-unknown-method",
        "a method this node does not serve",
        {"request/id": "conformance-request-12", "method": "sensorium.nope"},
        malformed("$.method"),
    ),
    (
        "13-unknown-envelope-field",
        "request envelopes are closed",
        {**invoke(13), "extra": 1},
        malformed("$"),
    ),
    (
        "14-async-on-sync-only",
        "timing.mode async for a sync-only action",
        invoke(14, timing={"mode": "async", "timeout_ms": 5000}),
        rejected("execution-mode-unsupported", "$.timing.mode"),
    ),
    (
        "15-json-body",
        "JSON instead of MessagePack: told so, request/id still echoed",
        {"$raw": base64.b64encode(json.dumps(invoke(15)).encode()).decode()},
        malformed("$"),
    ),
]


def _render(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$bin": base64.b64encode(value).decode()}
    if isinstance(value, dt.datetime):
        return {"$timestamp": value.isoformat().replace("+00:00", "Z")}
    if isinstance(value, dict):
        return {k: _render(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v) for v in value]
    return value


def request_id(request: Any) -> str:
    if "$raw" in request:
        return str(json.loads(base64.b64decode(request["$raw"]))["request/id"])
    return str(request["request/id"])


def main() -> None:
    for old in HERE.glob("*.msgpack"):
        old.unlink()
    for old in HERE.glob("[0-9]*.json"):
        old.unlink()
    for name, description, request, expect in CASES:
        raw = (
            base64.b64decode(request["$raw"])
            if "$raw" in request
            else msgspec.msgpack.encode(request)
        )
        (HERE / f"{name}.msgpack").write_bytes(raw)
        doc = {
            "description": description,
            "request": _render(request),
            "expect": {"request/id": request_id(request), **expect},
        }
        (HERE / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
