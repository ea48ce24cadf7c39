"""Per-directive cost of catalog authorization and of parameter validation, on a catalog
of 1,000 declarations.

Measured in one process, with the product's own code: the connector's per-dispatch
``Authorizer.check()`` (a stat of the sidecar, node.json and every catalog source, then
the cached verdict) and a forced full re-verification (re-merge, RFC 8785 hash, Ed25519
verify — what any edit triggers); core's ``admit()`` of a directive with valid parameters
against its compiled JSON Schema. Peer: the same loop with the check disabled (a no-op
call), so each ratio is the overhead a directive pays for it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import emit, machine, parse_args, row

from sensorium.connectors.os.catalog import sources as catalog_mod
from sensorium.connectors.os.catalog.authorization import Authorizer, bootstrap, sign_effective
from sensorium.connectors.os.catalog.report import build_report
from sensorium.connectors.os.envelope.probe import Runtime
from sensorium.core.admission import admit
from sensorium.core.resolution import ResolutionMap
from sensorium.shared.config import Limits, load_node_config
from sensorium.shared.ids import new_id
from sensorium.shared.keys import new_operator_key, trust_signer
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.directive import Issuer, new_directive

BENCH_AUTH = "authorization check"
BENCH_PARAMS = "parameter validation"
N_DECLARATIONS = 1000
ITERATIONS = 20_000


def _declaration(i: int) -> dict[str, Any]:
    return {
        "action_id": f"bench.a{i:04d}",
        "class": "read-only-spawn",
        "executable": {
            "kind": "binary",
            "path": "/usr/bin/true",
            "argv_shape": ["true", "--", "{{path}}"],
        },
        "parameters_schema": {
            "type": "object",
            "required": ["path", "lines"],
            "properties": {
                "path": {"type": "string", "pattern": "^/", "maxLength": 4096},
                "lines": {"type": "integer", "minimum": 1, "maximum": 10000},
            },
            "additionalProperties": False,
        },
    }


def _per_call_us(fn: Callable[[], object], n: int) -> float:
    for _ in range(min(n, 1000)):
        fn()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1000


def run() -> dict[str, Any]:
    m = machine()
    root = Path(tempfile.mkdtemp(prefix="sa-", dir="/tmp"))
    try:
        import json

        paths = StatePaths(root)
        paths.ensure()
        dropin = paths.connectors_config / "sensorium-os.d"
        dropin.mkdir(parents=True, exist_ok=True)
        (dropin / "bench.json").write_text(
            json.dumps({"action_catalog": [_declaration(i) for i in range(N_DECLARATIONS)]})
        )
        t0 = time.perf_counter_ns()
        cat = catalog_mod.load(paths)
        load_ms = (time.perf_counter_ns() - t0) / 1e6
        pair, _ = new_operator_key(paths, "did:bench:operator")
        trust_signer(paths, pair)
        sign_effective(paths, pair)
        verdict, _signed = bootstrap(paths, load_node_config(paths), cat)
        assert verdict.authorized, verdict
        authorizer = Authorizer(paths, cat, verdict)

        def noop() -> None:
            return None

        check_us = _per_call_us(authorizer.check, ITERATIONS)
        reverify_us = _per_call_us(authorizer._reverify, 20)
        off_us = _per_call_us(noop, ITERATIONS)

        resolution = ResolutionMap()
        # Every action counted as enabled: this measures authorization, not the sandbox.
        report = build_report(
            cat, verdict, new_id(), "now", lambda _d: ("enabled", []), Runtime.read()
        )
        resolution.load(report)
        directive = new_directive(
            "bench.a0500",
            {"path": "/etc/hostname", "lines": 3},
            issuer=Issuer(module_id="sensorium.bench"),
        )
        limits = Limits()
        resolved = resolution.get("bench.a0500")
        assert resolved is not None
        admit_us = _per_call_us(
            lambda: admit(directive, resolution, limits, connected=True), ITERATIONS
        )
        original = resolved.check
        object.__setattr__(resolved, "check", lambda _p: [])
        try:
            admit_off_us = _per_call_us(
                lambda: admit(directive, resolution, limits, connected=True), ITERATIONS
            )
        finally:
            object.__setattr__(resolved, "check", original)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [
        row(
            BENCH_AUTH,
            "per dispatch (stat-keyed cache)",
            check_us,
            off_us,
            unit="µs",
            peer_name="check disabled (no-op)",
        ),
        row(
            BENCH_AUTH,
            "full re-verify after an edit",
            reverify_us,
            off_us,
            unit="µs",
            peer_name="check disabled (no-op)",
        ),
        row(
            BENCH_PARAMS,
            "admit() with schema validation",
            admit_us,
            admit_off_us,
            unit="µs",
            peer_name="admit() with validation disabled",
        ),
    ]
    return {
        "name": "authorization_cost",
        "machine": m,
        "rows": rows,
        "notes": [
            f"authorization/validation: {N_DECLARATIONS} declarations (catalog load + "
            f"validation {load_ms:.0f} ms); {ITERATIONS} iterations per measurement"
        ],
    }


def main() -> None:
    args = parse_args(__doc__)
    emit(run(), args.json)


if __name__ == "__main__":
    main()
