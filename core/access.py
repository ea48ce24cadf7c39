"""Who may read or steer a deferred operation or a flow, and how much of it sees
(issue 16, items 5 and 9; README "Who may talk to it").

Over ipc (no CURVE: the local operator's 0700 socket) and with the node's own key
(the poller, the local CLI on tcp) the caller is the **operator**: it sees every
operation and flow. A CURVE client sees:

- **its own** operations and flows (the ones its key created): status, list, cancel,
  and the raw outcome when it asks for it (``include_result``) while its key is
  still granted the operation's action;
- **others'** operations whose action its key is granted: status, list and cancel,
  never the raw outcome (``include_result`` is refused); other flows only when it
  is granted every step's action, and then without their context;
- nothing else: a status, cancel or flow status of another's operation or flow is
  ``grant-denied``, and a list leaves them out.

Status carries a summary with references by default, whoever asks: the raw outcome
(argv with its parameters, stdout, stderr, the structured result) only with
``include_result`` (seed 002 §Invariants: no raw private payloads by default).
Every ``grant-denied`` (a read, a cancel, an invoke, a flow run) leaves a
``rejection`` record in the audit store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import msgspec
import structlog

from sensorium.core.audit import AuditRecord, AuditStore
from sensorium.core.grants import GroupOf, granted
from sensorium.core.records import refusal
from sensorium.shared.clock import rfc3339
from sensorium.shared.deferred.continuations import Flow
from sensorium.shared.deferred.registry import Operation
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.curve import Allowlist
from sensorium.shared.rpc.curvekeys import ClientEntry, fingerprint
from sensorium.shared.rpc.server import PEER, Authorize
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.deferred import DeferredOperationStatus

log = structlog.get_logger("sensorium.core")
_encoder = msgspec.msgpack.Encoder()
# full: everything, the raw outcome on request; summary: status and references only.
Level = Literal["full", "summary", "none"]
WITHHELD = (
    "withheld: the raw outcome (argv, stdout, stderr, result) is given only to the key "
    "that created the operation, or the operator, asking with include_result"
)


@dataclass(frozen=True)
class Caller:
    """Who is asking: ``key`` is its CURVE key, ``None`` over ipc."""

    key: str | None
    entry: ClientEntry | None
    operator: bool

    @property
    def owner_key(self) -> str | None:
        """What an operation or flow it creates records as its creator."""
        return None if self.operator else self.key

    @property
    def grants(self) -> tuple[str, ...]:
        return self.entry.grants if self.entry is not None else ()

    @property
    def fingerprint(self) -> str | None:
        return fingerprint(self.key) if self.key is not None else None

    def describe(self) -> str:
        if self.entry is not None:
            return f"client {self.entry.name} ({self.fingerprint})"
        return f"key {self.fingerprint}" if self.key is not None else "this caller"


class Access:
    def __init__(
        self, audit: AuditStore, group_of: GroupOf, actions: Callable[[], Iterable[str]]
    ) -> None:
        self._audit = audit
        self._group_of = group_of
        self._actions = actions
        self._allowlist: Allowlist | None = None
        self._node_key: str | None = None

    def clients(self, allowlist: Allowlist, node_key: str) -> None:
        """Serving CURVE clients: who they are, and which key is the node's own."""
        self._allowlist = allowlist
        self._node_key = node_key

    def __repr__(self) -> str:
        return f"<Access curve={self._allowlist is not None}>"

    def caller(self) -> Caller:
        """The caller of the request being handled (from its connection's CURVE key)."""
        key = PEER.get()
        if key is None or self._allowlist is None:
            return Caller(None, None, True)
        entry = self._allowlist.lookup(key)
        return Caller(key, entry, key == self._node_key)

    def _granted(self, caller: Caller, action_id: str) -> bool:
        return granted(caller.grants, action_id, self._group_of(action_id))

    def level(self, caller: Caller, action_id: str, owner_key: str | None) -> Level:
        if caller.operator:
            return "full"
        mine = owner_key is not None and owner_key == caller.key
        if self._granted(caller, action_id):
            return "full" if mine else "summary"
        return "summary" if mine else "none"

    def operation(
        self, caller: Caller, op: Operation, what: str, request_id: str, include_result: bool
    ) -> None:
        """Refuse (audited) a read or cancel of ``op`` the caller may not make."""
        level = self.level(caller, op.action_id, op.caller_key)
        if level == "none":
            self.deny(
                caller,
                what,
                op.operation_id,
                op.action_id,
                request_id,
                "it was created by another key and this key is not granted its action",
            )
        if include_result and level != "full":
            why = WITHHELD.removeprefix("withheld: ")
            self.deny(
                caller,
                f"{what} with include_result",
                op.operation_id,
                op.action_id,
                request_id,
                why,
            )

    def flow(self, caller: Caller, flow: Flow, steps: list[str], request_id: str) -> Level:
        """How much of ``flow`` the caller may see; refuses (audited) when nothing."""
        if caller.operator or (flow.caller_key is not None and flow.caller_key == caller.key):
            return "full"
        if steps and all(self._granted(caller, a) for a in steps):
            return "summary"
        self.deny(
            caller,
            "read the flow",
            flow.flow_id,
            ",".join(dict.fromkeys(steps))[:128] or "-",
            request_id,
            "it was started by another key and this key is not granted every step's action",
        )

    def visible(self, caller: Caller) -> tuple[str, frozenset[str]] | None:
        """(key, granted action ids) for a list; None: the operator sees everything."""
        if caller.operator or caller.key is None:
            return None
        return caller.key, frozenset(a for a in self._actions() if self._granted(caller, a))

    def deny(
        self, caller: Caller, what: str, subject: str, action_id: str, request_id: str, why: str
    ) -> NoReturn:
        exc = CodedError(
            RuntimeErrorCode.GRANT_DENIED,
            f"{caller.describe()} may not {what} {subject[:140]}: {why}",
            detail={"client": caller.entry.name if caller.entry else ""},
        )
        self._audit.enqueue(denial(subject, action_id, request_id, what, caller, exc))
        raise exc

    def audited(self, authorize: Authorize, skip: type | None = None) -> Authorize:
        """``authorize`` whose ``grant-denied`` refusals (invoke, flow run, cancel)
        are recorded in the audit store too, not only logged. Requests of type ``skip``
        pass: their handler checks them itself (an invoke's refusal is its result)."""

        def check(peer_key: str | None, request: Any) -> None:
            if skip is not None and isinstance(request, skip):
                return
            try:
                authorize(peer_key, request)
            except CodedError as exc:
                if exc.code == RuntimeErrorCode.GRANT_DENIED:
                    self._audit.enqueue(_request_denial(request, peer_key, exc))
                raise

        return check


def summarize(status: DeferredOperationStatus) -> DeferredOperationStatus:
    """``status`` with its raw outcome replaced by a summary with references."""
    if status.result_or_none is None:
        return status
    return msgspec.structs.replace(status, result=result_summary(status.result))


def result_summary(raw: Any) -> dict[str, Any]:
    """A ``sensorium-directive-result.v1`` for an outcome: ids, status, exit, sizes and
    artifact references; never argv, parameters, stdout, stderr or the result body."""
    out: dict[str, Any] = raw if isinstance(raw, dict) else {}
    status = out.get("status")
    streams = {
        f"{name}_bytes": s.get("bytes_total")
        for name in ("stdout", "stderr")
        if isinstance(s := out.get(name), dict)
    }
    artifacts = [
        {
            "artifact/id": ref.get("id"),
            "role": "produced-file",
            "media_type": ref.get("media_type"),
            "size_bytes": ref.get("size"),
        }
        for ref in out.get("artifact_refs") or []
        if isinstance(ref, dict)
    ]
    summary: dict[str, Any] = {
        "schema": "sensorium-directive-result.v1",
        "schema/v": 1,
        "directive/id": str(out.get("directive/id") or ""),
        "status": "timed_out" if status == "timed-out" else status,
        "outcome/id": str(out.get("outcome/id") or ""),
        "observation/ids": [],
        "artifacts": artifacts,
        "exit_code": out.get("exit_code"),
        "signal": out.get("signal"),
        "duration_ms": out.get("duration_ms"),
        **streams,
        "files_touched": len(out.get("files_touched") or []),
        "diagnostics": [
            {"code": d.get("code"), "level": "error"}
            for d in out.get("diagnostics") or []
            if isinstance(d, dict)
        ],
        "raw": WITHHELD,
    }
    if out.get("correlation/id"):
        summary["correlation/id"] = out["correlation/id"]
    return summary


def denial(
    subject: str, action_id: str, request_id: str, what: str, caller: Caller, exc: CodedError
) -> AuditRecord:
    rid = new_id()
    log.info(
        "access.denied",
        what=what,
        subject=subject[:140],
        client=caller.fingerprint,
        receipt=f"rejection:{rid}",
    )
    body = {
        "code": exc.code,
        "message": exc.message,
        "what": what,
        "subject": subject[:140],
        "client": caller.fingerprint,
    }
    return AuditRecord(
        record_id=rid,
        kind="rejection",
        directive_id=subject[:140],
        action_id=action_id[:128],
        status="rejected",
        code=exc.code,
        request_id=request_id,
        recorded_at=rfc3339(),
        body=_encoder.encode(body),
    )


def _request_denial(request: Any, peer_key: str | None, exc: CodedError) -> AuditRecord:
    if isinstance(request, Invoke):
        return refusal(request, "rejection", exc)
    tag = str(type(request).__struct_config__.tag)
    subject = str(getattr(request, "operation_id", None) or tag)
    caller = Caller(peer_key, None, False)
    action = exc.detail.get("group") or "-"
    return denial(subject, action, request.request_id, tag, caller, exc)
