"""Generate the JSON Schemas (draft 2020-12) in ``schemas/`` from the wire Structs.

The Structs are the source of truth; the committed ``schemas/*.schema.json`` files
are their published form, and ``tests/unit/test_schemas.py`` fails when the two
drift apart. Regenerate after changing a Struct::

    python -m sensorium.shared.wire.schemagen --write [DIR]
    python -m sensorium.shared.wire.schemagen --check [DIR]   # exit 1 when stale
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from sensorium.shared.config import NodeConfig
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.wire.audit import AuditPage, OutcomeRecord
from sensorium.shared.wire.client_api import (
    CatalogView,
    ClientRequest,
    DirectiveList,
    HealthReply,
    Ledger,
    ObservationPage,
    RecordingStatus,
    TopicSummary,
)
from sensorium.shared.wire.continuation import Continuation
from sensorium.shared.wire.declaration import SUBJECT_TOGETHER, ConnectorConfig, Declaration
from sensorium.shared.wire.deferred import (
    ALWAYS_EMITTED,
    CANCEL_SURFACE,
    COMPLETED_HAS_RESULT,
    ConnectorDeferred,
    DeferredOperation,
    DeferredOperationStatus,
    OperationList,
    OperationStatuses,
)
from sensorium.shared.wire.directive import DELEGATION_NEEDS_SIGNATURE, ISSUER_NAMED, Directive
from sensorium.shared.wire.envelope import Reply
from sensorium.shared.wire.flow import FlowDefinition, FlowStatus
from sensorium.shared.wire.fs_policy import FsPolicy
from sensorium.shared.wire.observation import Observation
from sensorium.shared.wire.orphan import OrphanEventReceipt
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.recording import RecordedRequest, RecordingHeader
from sensorium.shared.wire.report import ModuleReport
from sensorium.shared.wire.result import NO_RESULT_UNLESS_RAN, DirectiveResult
from sensorium.shared.wire.seam import (
    ConnectorStatuses,
    EndedJobs,
    InterruptAnswer,
    SeamRequestUnion,
    StartsAnswer,
)
from sensorium.shared.wire.signature import ConfigSignature
from sensorium.shared.wire.supervisor_api import ControlRequestUnion, SupervisorStatusReply

METASCHEMA = "https://json-schema.org/draft/2020-12/schema"
ID_PREFIX = "https://sensorium.dev/schemas/"
SUFFIX = ".schema.json"

# Schema name -> the type it describes (a Struct, a tagged union, or a StrEnum).
SCHEMAS: dict[str, object] = {
    "sensorium-directive.v1": Directive,
    "sensorium-directive-result.v1": DirectiveResult,
    "sensorium-directive-outcome.v1": OutcomeRecord,
    "sensorium-os-execution.v1": Outcome,
    "sensorium-audit-page.v1": AuditPage,
    "sensorium-os-error-codes.v1": OsErrorCode,
    "sensorium-runtime-error-codes.v1": RuntimeErrorCode,
    "sensorium-action-declaration.v1": Declaration,
    "sensorium-os-config.v1": ConnectorConfig,
    "middleware-module-report.v1": ModuleReport,
    "deferred-operation.v1": DeferredOperation,
    "deferred-operation-status.v1": DeferredOperationStatus,
    "sensorium-connector-deferred.v1": ConnectorDeferred,
    "orbiplex-continuation.v1": Continuation,
    "sensorium-flow.v1": FlowDefinition,
    "sensorium-flow-status.v1": FlowStatus,
    "sensorium-operation-list.v1": OperationList,
    "sensorium-client-request.v1": ClientRequest,
    "sensorium-connector-request.v1": SeamRequestUnion,
    "sensorium-connector-starts.v1": StartsAnswer,
    "sensorium-connector-ended.v1": EndedJobs,
    "sensorium-connector-statuses.v1": ConnectorStatuses,
    "sensorium-operation-statuses.v1": OperationStatuses,
    "sensorium-connector-interrupt.v1": InterruptAnswer,
    "sensorium-supervisor-request.v1": ControlRequestUnion,
    "sensorium-reply.v1": Reply,
    "sensorium-catalog-view.v1": CatalogView,
    "sensorium-capability-ledger.v1": Ledger,
    "sensorium-health.v1": HealthReply,
    "sensorium-supervisor-status.v1": SupervisorStatusReply,
    "sensorium-node-config.v1": NodeConfig,
    "orbiplex-connector-config-signature.v1": ConfigSignature,
    "sensorium-observation.v1": Observation,
    "sensorium-observation-page.v1": ObservationPage,
    "sensorium-topic-summary.v1": TopicSummary,
    "sensorium-directive-list.v1": DirectiveList,
    "sensorium-fs-policy.v2": FsPolicy,
    "sensorium-orphan-event-receipt.v1": OrphanEventReceipt,
    "sensorium-recording.v1": RecordingHeader,
    "sensorium-recorded-request.v1": RecordedRequest,
    "sensorium-recording-status.v1": RecordingStatus,
}


CONSTRAINTS: dict[str, dict[str, Any]] = {
    "DeferredOperation": CANCEL_SURFACE,
    "ConnectorDeferred": CANCEL_SURFACE,
    "DeferredOperationStatus": COMPLETED_HAS_RESULT,
    "Issuer": ISSUER_NAMED,
    "Directive": DELEGATION_NEEDS_SIGNATURE,
    "ResultContract": SUBJECT_TOGETHER,
    "DirectiveResult": NO_RESULT_UNLESS_RAN,
}


def generate(name: str) -> dict[str, Any]:
    """The JSON Schema document for ``name`` (a key of :data:`SCHEMAS`)."""
    body: dict[str, Any] = msgspec.json.schema(SCHEMAS[name])
    # Invariants a Struct checks in __post_init__, written where the type is defined so
    # they hold wherever it is embedded (a flow status carries a handle, say).
    for struct, constraint in CONSTRAINTS.items():
        if struct in body.get("$defs", {}):
            body["$defs"][struct].update(constraint)
    for struct, fields in ALWAYS_EMITTED.items():
        if struct in body.get("$defs", {}):
            target = body["$defs"][struct]
            target["required"] = sorted({*target.get("required", []), *fields})
    return {
        "$schema": METASCHEMA,
        "$id": f"{ID_PREFIX}{name}{SUFFIX}",
        "title": name,
        **_ecma_patterns(body),
    }


def _ecma_patterns(node: Any) -> Any:
    """The Structs' patterns end in ``\\Z``: Python's ``$`` (msgspec's and ``re``'s)
    also matches before a final newline, so ``"demo.fs.stat\\n"`` would pass as an
    action id. JSON Schema's ECMA-262 ``$`` is already the end of the text, and ``\\Z``
    means something else there: the published form says ``$``."""
    if isinstance(node, dict):
        return {
            k: v[:-2] + "$"
            if k == "pattern" and isinstance(v, str) and v.endswith("\\Z")
            else _ecma_patterns(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_ecma_patterns(v) for v in node]
    return node


def render(name: str) -> str:
    """The exact text of ``<name>.schema.json`` as committed."""
    return json.dumps(generate(name), indent=2, sort_keys=True) + "\n"


def default_dir() -> Path:
    """The ``schemas/`` folder of the installed ``sensorium.schemas`` package."""
    return Path(str(importlib.resources.files("sensorium.schemas")))


def write(directory: Path) -> list[Path]:
    """Write every schema into ``directory``; return the files whose text changed."""
    directory.mkdir(parents=True, exist_ok=True)
    changed: list[Path] = []
    for name in SCHEMAS:
        target = directory / f"{name}{SUFFIX}"
        text = render(name)
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            changed.append(target)
    return changed


def check(directory: Path) -> list[str]:
    """Problems with ``directory``: missing, stale or unexpected schema files."""
    problems: list[str] = []
    for name in SCHEMAS:
        target = directory / f"{name}{SUFFIX}"
        if not target.is_file():
            problems.append(f"missing: {target}")
        elif target.read_text(encoding="utf-8") != render(name):
            problems.append(f"stale: {target}")
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        if path.name.removesuffix(SUFFIX) not in SCHEMAS:
            problems.append(f"unexpected (no SCHEMAS entry): {path}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sensorium.shared.wire.schemagen",
        description="Generate or check the JSON Schemas of the wire messages.",
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", nargs="?", const="", metavar="DIR", help="write the schemas")
    mode.add_argument("--check", nargs="?", const="", metavar="DIR", help="exit 1 when stale")
    args = parser.parse_args(argv)
    if args.write is not None:
        directory = Path(args.write) if args.write else default_dir()
        for path in write(directory):
            print(f"wrote {path}")
        return 0
    directory = Path(args.check) if args.check else default_dir()
    problems = check(directory)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(
            "run `python -m sensorium.shared.wire.schemagen --write` to regenerate",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
