"""Valid documents of every input the property tests break: the starting points that
``fuzz_strategies.mutated`` edits, so that most examples get past the first check."""

from __future__ import annotations

from typing import Any

DIRECTIVE: dict[str, Any] = {
    "schema": "sensorium-directive.v1",
    "schema/v": 1,
    "directive/id": "01HZZZZZZZZZZZZZZZZZZZZZZZ",
    "directive/issued_at": "2026-05-05T18:00:00Z",
    "issuer": {"module_id": "sensorium.fuzz"},
    "action_id": "demo.fs.read-head",
    "parameters": {"path": "/etc/hosts", "lines": 10, "opts": {"a": [1, 2.5, None, True]}},
    "timing": {"mode": "sync", "timeout_ms": 5000, "deadline_at": "2030-01-01T00:00:00Z"},
    "idempotency/key": "k-1",
    "correlation/id": "c-1",
}
FLOW: dict[str, Any] = {
    "steps": [
        {
            "step_id": "first",
            "action_id": "demo.fs.read-head",
            "parameters": {"path": "${path}"},
            "output_binding": "head",
            "mode": "sync",
            "timeout_ms": 1000,
        }
    ],
    "deferred_response_mode": "surface-to-caller",
}
CLIENT_REQUESTS: list[dict[str, Any]] = [
    {"request/id": "r1", "method": "sensorium.directive.invoke", "directive": DIRECTIVE},
    {"request/id": "r2", "method": "sensorium.operation.status", "operation/id": "op-1",
     "refresh": True},
    {"request/id": "r3", "method": "sensorium.operation.cancel", "operation/id": "op-1"},
    {"request/id": "r4", "method": "sensorium.operation.list", "limit": 10, "open_only": True},
    {"request/id": "r5", "method": "sensorium.flow.run", "flow": FLOW,
     "context": {"path": "/etc/hosts"}, "correlation/id": "c"},
    {"request/id": "r6", "method": "sensorium.flow.status", "flow/id": "f-1"},
    {"request/id": "r7", "method": "sensorium.catalog.describe"},
    {"request/id": "r8", "method": "sensorium.ledger.query", "action_id": "demo.fs.read-head"},
    {"request/id": "r9", "method": "health"},
    {"request/id": "r10", "method": "sensorium.health"},
    {"request/id": "r11", "method": "sensorium.directive.list"},
    {"request/id": "r12", "method": "sensorium.observe.query", "signal/kind-prefix": "release",
     "since": "2026-05-05T00:00:00Z", "sensitivity": ["public"], "limit": 10, "cursor": "x"},
    {"request/id": "r13", "method": "sensorium.observation.get", "observation/id": "o-1"},
    {"request/id": "r14", "method": "sensorium.topic.summary", "subject/kind": "self"},
]  # fmt: skip
SEAM_REQUESTS: list[dict[str, Any]] = [
    {"request/id": "s1", "method": "sensorium.connector.invoke", "directive": DIRECTIVE,
     "timeout_ms": 5000, "config/hash": "0" * 64, "operation/id": "op-1"},
    {"request/id": "s2", "method": "sensorium.connector.status", "operation/id": "op-1"},
    {"request/id": "s3", "method": "sensorium.connector.cancel", "operation/id": "op-1"},
    {"request/id": "s4", "method": "sensorium.connector.report"},
]  # fmt: skip
DIAGNOSTIC = {"code": "action-timeout", "message": "took too long", "path": "$.timing"}
OUTCOME: dict[str, Any] = {
    "schema": "sensorium-directive-outcome.v1",
    "schema/v": 1,
    "outcome/id": "o-1",
    "directive/id": "d-1",
    "action_id": "demo.fs.read-head",
    "status": "completed",
    "argv": ["head", "-n", "10", "--", "/etc/hosts"],
    "exit_code": 0,
    "started_at": "2026-01-01T00:00:00Z",
    "duration_ms": 1.5,
    "timeout_ms": 5000,
    "stdout": {"text": "x", "bytes_total": 1, "bytes_captured": 1, "truncated": False},
    "result": {"json": {"a": 1}, "pointers": {"a": 1}},
    "files_touched": [{"path": "/w/x", "bytes": 3, "sha256": "0" * 64}],
    "network_transcript": [
        {"host": "h", "port": 443, "protocol": "https", "bytes_sent": 1, "bytes_received": 2,
         "duration_ms": 3}
    ],
    "artifact_refs": [{"id": "sha256:" + "0" * 64, "role": "out", "media_type": "text/plain"}],
    "diagnostics": [DIAGNOSTIC],
}  # fmt: skip
DEFERRED: dict[str, Any] = {
    "schema": "deferred-operation.v1",
    "schema/v": 1,
    "status": "deferred",
    "operation/id": "op-1",
    "retry_after_seconds": 5,
    "created_at": "2026-01-01T00:00:00Z",
    "expires_at": "2026-01-02T00:00:00Z",
    "cancel_href": "sensorium.operation.cancel",
    "diagnostics": [DIAGNOSTIC],
    "extensions": {"x": 1},
}
DEFERRED_STATUS: dict[str, Any] = {
    "schema": "deferred-operation-status.v1",
    "operation/id": "op-1",
    "status": "completed",
    "retry_after_seconds": 5,
    "attempt_no": 2,
    "result": OUTCOME,
    "diagnostics": [DIAGNOSTIC],
}
CONNECTOR_DEFERRED: dict[str, Any] = {
    "schema": "sensorium-connector-deferred.v1",
    "operation/id": "op-1",
    "status": "running",
    "retry_after_seconds": 2,
    "fail_after_seconds": 60,
    "created_at": "2026-01-01T00:00:00Z",
    "cancel/unavailable-reason": "uninterruptible",
}
REPLY: dict[str, Any] = {
    "request/id": "r1",
    "ok": False,
    "error": {"code": "overloaded", "message": "later", "path": None, "retry_after_ms": 200,
              "detail": {"reason": "x"}},
}  # fmt: skip

DECLARATION: dict[str, Any] = {
    "action_id": "fuzz.read-head",
    "class": "read-only-spawn",
    "group": "fuzz",
    "executable": {
        "kind": "binary",
        "path": "/usr/bin/head",
        "argv_shape": ["head", "-n", "{{lines}}", "--", "{{path}}"],
    },
    "parameters_schema": {
        "type": "object",
        "required": ["path", "lines"],
        "properties": {
            "path": {"type": "string", "pattern": "^/", "maxLength": 4096},
            "lines": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        "$defs": {"unused": {"type": "string"}},
        "additionalProperties": False,
    },
    "default_timeout_ms": 5000,
    "max_timeout_ms": 30000,
    "limits": {"stdout_max_bytes": 65536, "stderr_max_bytes": 4096},
    "environment": {"inherit": False, "set": {"LC_ALL": "C"}},
    "result_contract": {"stdout_format": "text", "signal_kind": "sensorium.fuzz/head"},
    "execution_mode_support": "either",
    "deferred_profile": {"preferred_retry_after_seconds": 2},
    "fs_profile": "tools",
}
POLICY: dict[str, Any] = {
    "schemaVersion": 2,
    "fsProfiles": {
        "tools": {
            "read": ["/usr/**", "./**", "/etc/*.conf", "!/etc/shadow"],
            "modify": ["./out/**"],
        }
    },
    "denyRead": ["/root/**", "**/*.env"],
    "denyModify": ["/etc/**"],
}
CATALOG: dict[str, Any] = {
    "schema": "sensorium-os-config.v1",
    "allow_unsigned_bootstrap": False,
    "action_catalog": [DECLARATION],
    "policy": POLICY,
}
