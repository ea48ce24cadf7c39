"""Which actions a CURVE client may invoke (DESIGN §2, "who may talk to it").

Over tcp, core's ZAP handler has already refused every key not on the allowlist;
this is the second gate, per request, for the keys it let in. A client's grant (the
``grants`` of its ``keys/curve/clients/NAME.key``) names actions by id (seed 048:
``group`` carries no enforcement meaning) or, as a convenience, by group:

- ``ACTION``: that action id (``demo.fs.stat``);
- ``PREFIX.*``: every action id under ``PREFIX.`` (``demo.fs.*``), and the group
  ``PREFIX`` and every group ``PREFIX.something``;
- ``GROUP``: actions whose declaration says ``"group": "GROUP"`` (a display aid an
  operator may also grant by);
- ``*``: every action.

``sensorium keys client add/grant`` refuses a name that matches nothing in the catalog,
so a grant is never a typo that silently grants nothing. The grant ``audit`` is a read
grant, given by name (``core/auditread.py``).

What is checked: ``invoke`` (the directive's action), ``flow.run`` (every step's
action) and ``operation.cancel`` (the operation's action). An ``invoke`` is also
checked for the issuer it claims (issue 24, item 2): its ``issuer.module_id`` must be
one the key is bound to (``keys client add NAME --module ID``, ``keys client bind``;
a key bound to none may claim only its own client name; ``*``: any), and a ``participant/did:key``
is taken only with a signature that proves it (``core/authenticity.py``) unless the
key may claim any issuer. The node's own key may claim any issuer, as ipc does.
Reads (health, describe, ledger, and 045's directive.list and observation reads) are
open to every allowlisted key; deferred status, list and flow status are scoped to the
caller by ``core/access.py``, directive.list and the observation reads by
``core/consumer_reads.py`` (the key's granted actions). A key revoked
while connected is refused from its next request on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sensorium.shared.config import NodeConfig
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.curve import Allowlist, CurveServer, core_server_curve
from sensorium.shared.rpc.curvekeys import ALL_GROUPS, ANY_MODULE, ClientEntry, fingerprint
from sensorium.shared.rpc.server import Authorize
from sensorium.shared.wire.client_api import RECORD_CONTROL, FlowRun, Invoke, OperationCancel
from sensorium.shared.wire.directive import Directive

GroupOf = Callable[[str], str | None]


def matches(grant: str, action_id: str | None, group: str | None) -> bool:
    """Whether one grant names this action, by its id or its group."""
    if grant == ALL_GROUPS:
        return True
    prefix = grant[:-1] if grant.endswith(".*") else None
    if action_id is not None and (
        grant == action_id or (prefix is not None and action_id.startswith(prefix))
    ):
        return True
    if group is None:
        return False
    return grant == group or (
        prefix is not None and (group == grant[:-2] or group.startswith(prefix))
    )


def granted(grants: tuple[str, ...], action_id: str | None, group: str | None) -> bool:
    """Whether any of ``grants`` names the action (``action_id`` None: no action, only
    ``*`` grants it)."""
    return any(matches(g, action_id, group) for g in grants)


class Grants:
    """``authorize(peer_key, request)`` for core's RpcServer; raises ``grant-denied``."""

    def __init__(
        self,
        allowlist: Allowlist,
        group_of: GroupOf,
        action_of_operation: Callable[[str], str | None] | None = None,
    ) -> None:
        self._allowlist = allowlist
        self._group_of = group_of
        self._action_of_operation = action_of_operation

    def __repr__(self) -> str:
        return f"<Grants {self._allowlist!r}>"

    def authorize(self, peer_key: str | None, request: Any) -> None:
        # Every request re-checks the key: a revoked one loses reads on a connection
        # it already has, not only invokes.
        needs = self._needs(request)
        if needs is None and peer_key is None:
            return
        entry = self._entry(peer_key)
        for what, action, group in needs or ():  # none: a read, any allowlisted key may
            self._check(entry, what, action, group)
        if isinstance(request, Invoke):
            self._check_issuer(entry, request.directive)

    def _needs(self, request: Any) -> list[tuple[str, str | None, str | None]] | None:
        """(what is asked for, its action, its group) for each action a request would run
        or stop."""
        if isinstance(request, Invoke):
            ids = [request.directive.action_id]
        elif isinstance(request, FlowRun):
            ids = [step.action_id for step in request.flow.steps]
        elif isinstance(request, RECORD_CONTROL):
            # A recording holds every client's parameters: only the widest grant.
            return [("control recordings", None, None)]
        elif isinstance(request, OperationCancel):
            op = request.operation_id[:64]
            if self._action_of_operation is None:
                # Without a way to name its action, a cancel needs the widest grant.
                return [(f"cancel operation {op}", None, None)]
            action = self._action_of_operation(request.operation_id)
            if action is None:
                return []  # unknown: core says so itself
            what = f"cancel operation {op} of {action[:128]}"
            return [(what, action, self._group_of(action))]
        else:
            return None
        return [(f"invoke {a[:128]}", a, self._group_of(a)) for a in dict.fromkeys(ids)]

    def _entry(self, peer_key: str | None) -> ClientEntry:
        if peer_key is None:
            # Only a CURVE connection names its key; without one nothing is granted.
            raise CodedError(RuntimeErrorCode.GRANT_DENIED, "this connection carries no CURVE key")
        entry = self._allowlist.lookup(peer_key)
        if entry is None:
            raise CodedError(
                RuntimeErrorCode.GRANT_DENIED,
                f"key {fingerprint(peer_key)} is no longer allowlisted (revoked); reconnect "
                "with a key the node's operator has added",
            )
        return entry

    def _check(self, entry: ClientEntry, what: str, action: str | None, group: str | None) -> None:
        if granted(entry.grants, action, group):
            return
        where = f"group {group!r}" if group is not None else "no group"
        raise CodedError(
            RuntimeErrorCode.GRANT_DENIED,
            f"client {entry.name} ({entry.fingerprint}) may not {what} (in {where}): this "
            f"client is granted {', '.join(entry.grants) or 'nothing'}; the node's operator "
            f"can widen it with `sensorium keys client grant {entry.name} ACTION-OR-GROUP`",
            detail={"client": entry.name, "group": group or ""},
        )

    def _check_issuer(self, entry: ClientEntry, d: Directive) -> None:
        claimed = d.issuer.module_id
        if claimed is not None and not entry.may_claim(claimed):
            raise CodedError(
                RuntimeErrorCode.GRANT_DENIED,
                f"client {entry.name} ({entry.fingerprint}) may not issue as module "
                f"{claimed[:128]!r}: it may claim {', '.join(entry.claims)}; the node's "
                f"operator can bind it with `sensorium keys client bind {entry.name} ID`",
                path="$.directive.issuer.module_id",
                detail={"client": entry.name, "issuer": claimed[:128]},
            )
        participant = d.issuer.participant_did_key
        if participant is not None and d.signature is None and ANY_MODULE not in entry.claims:
            raise CodedError(
                RuntimeErrorCode.GRANT_DENIED,
                f"client {entry.name} ({entry.fingerprint}) may not claim the participant "
                f"{participant[:80]} unsigned: sign the directive with that participant's key "
                "(or a delegated one), or leave participant/did:key out",
                path="$.directive.issuer.participant/did:key",
                detail={"client": entry.name, "issuer": participant[:128]},
            )


@dataclass(frozen=True)
class CoreSecurity:
    """What core's RpcServer is given: both ``None`` on ipc."""

    curve: CurveServer | None
    authorize: Authorize | None


def core_server_security(
    cfg: NodeConfig,
    paths: StatePaths,
    group_of: GroupOf,
    action_of_operation: Callable[[str], str | None] | None = None,
) -> CoreSecurity:
    """CURVE and grants for core's client API when it listens on tcp; nothing on ipc.

    Raises ``ConfigError`` when a tcp endpoint has no keys (never plaintext tcp)."""
    curve = core_server_curve(cfg, paths)
    if curve is None:
        return CoreSecurity(None, None)
    grants = Grants(curve.allowlist, group_of, action_of_operation)
    return CoreSecurity(curve, grants.authorize)
