"""The orphan-event queue and quarantine: lifecycle events no directive or operation
claimed (seed 003, section 4). Reads the audit store directly, so it works with
every process down.

  sensorium orphans list [--state queued|recovered|quarantined] [--limit N] [--json]
  sensorium orphans show ID [--json] [--body]   one event: keys, digest, receipt
                                                (--body: the stored event, as JSON)

Exit status: 0, or 1 when ``show`` names no such orphan.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import apsw
import msgspec

from sensorium.client.cli.terminal import printable
from sensorium.core.orphans_sql import COLUMNS
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.store import BUSY_TIMEOUT_MS
from sensorium.shared.wire.orphan import OrphanEventReceipt, OrphanView, ReconcileKeys

STATES = ("queued", "recovered", "quarantined")
TTY = sys.stdout.isatty()


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="orphans_command", required=True, metavar="SUBCOMMAND")
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state-dir", default=argparse.SUPPRESS, help="state directory")
    ls = sub.add_parser("list", parents=[state], help="queue and quarantine, newest first")
    ls.add_argument("--state", choices=STATES, help="only orphans in this state")
    ls.add_argument("--limit", type=_positive, default=50, help="at most this many (default 50)")
    ls.add_argument("--json", action="store_true", help="print them as JSON")
    show = sub.add_parser("show", parents=[state], help="one orphan event and its receipt")
    show.add_argument("orphan_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print it as JSON")
    show.add_argument(
        "--body", action="store_true", help="print the stored event body (queued, quarantined)"
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def run(args: argparse.Namespace) -> int:
    paths = StatePaths(resolve_state_dir(getattr(args, "state_dir", None)))
    views = _read(paths, getattr(args, "state", None), getattr(args, "orphan_id", None), args)
    if args.orphans_command == "show":
        if not views:
            raise CodedError(
                RuntimeErrorCode.ORPHAN_UNKNOWN,
                f"no orphan event {args.orphan_id!r} in {paths.audit_db}",
            )
        view = views[0]
        if args.body:
            return _print_body(paths, view.orphan_id)
        if args.json:
            print(msgspec.json.encode(view).decode())
        else:
            _print_detail(view)
        return 0
    if args.json:
        print(msgspec.json.encode(views).decode())
        return 0
    counts = _counts(paths)
    print(
        "orphan events: "
        + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATES)
        + f" ({paths.audit_db})"
    )
    for v in views:
        keys = " ".join(f"{k}={val}" for k, val in _keys(v.keys).items())
        print(
            f"{v.orphan_id}  {v.state:<11} {v.kind:<10} {v.received_at}  "
            f"{printable(keys, TTY)}  {printable(v.attached_to or '', TTY)}"
        )
    return 0


def _connect(paths: StatePaths) -> apsw.Connection | None:
    if not paths.audit_db.exists():
        return None
    conn = apsw.Connection(str(paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY)
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    has = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'orphans'"
    ).fetchone()
    if not has:
        conn.close()
        return None
    return conn


def _read(
    paths: StatePaths, state: str | None, orphan_id: str | None, args: argparse.Namespace
) -> list[OrphanView]:
    conn = _connect(paths)
    if conn is None:
        return []
    try:
        if orphan_id is not None:
            rows: list[Any] = conn.execute(
                f"SELECT {COLUMNS} FROM orphans WHERE orphan_id = ?", (orphan_id,)
            ).fetchall()
        else:
            where = "WHERE state = ?" if state else ""
            params: tuple[Any, ...] = (state, args.limit) if state else (args.limit,)
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM orphans {where} ORDER BY received_at DESC LIMIT ?",
                params,
            ).fetchall()
    finally:
        conn.close()
    return [_view(r) for r in rows]


def _counts(paths: StatePaths) -> dict[str, int]:
    conn = _connect(paths)
    if conn is None:
        return {}
    try:
        return {s: n for s, n in conn.execute("SELECT state, count(*) FROM orphans GROUP BY state")}
    finally:
        conn.close()


def _view(r: Any) -> OrphanView:
    (oid, kind, source, state, received, resolved, cid, did, opid, rid, attached) = r[:11]
    attempts, digest, receipt = r[11:]
    return OrphanView(
        orphan_id=oid,
        kind=kind,
        source=source,
        state=state,
        received_at=received,
        resolved_at=resolved,
        keys=ReconcileKeys(correlation_id=cid, directive_id=did, operation_id=opid, request_id=rid),
        attached_to=attached,
        attempts=attempts,
        digest=f"sha256:{digest}",
        receipt=msgspec.json.decode(receipt, type=OrphanEventReceipt) if receipt else None,
    )


def _keys(k: ReconcileKeys) -> dict[str, str]:
    return {
        name: value for name, value in msgspec.structs.asdict(k).items() if isinstance(value, str)
    }


def _print_detail(v: OrphanView) -> None:
    print(f"orphan {v.orphan_id}: {v.kind} from {v.source}, {v.state}")
    print(f"  received {v.received_at}" + (f", resolved {v.resolved_at}" if v.resolved_at else ""))
    for name, value in _keys(v.keys).items():
        print(f"  {name}: {printable(value, TTY)}")
    print(f"  body: {v.digest} (attempts to reconcile: {v.attempts})")
    if v.attached_to:
        print(f"  attached to {printable(v.attached_to, TTY)}")
    if v.receipt is not None:
        print("  receipt:")
        print(json.dumps(msgspec.to_builtins(v.receipt), indent=2).replace("\n", "\n    "))


def _print_body(paths: StatePaths, orphan_id: str) -> int:
    """The event as it arrived (MessagePack, shown as JSON); emptied once it attached
    to its owner (the owner's record holds it) or when quarantined past the bound."""
    conn = _connect(paths)
    if conn is None:
        return 1
    try:
        row: Any = conn.execute(
            "SELECT body FROM orphans WHERE orphan_id = ?", (orphan_id,)
        ).fetchone()
    finally:
        conn.close()
    body = bytes(row[0]) if row else b""
    if not body:
        print("the body is not kept (recovered: see what it attached to; or queue-full)")
        return 0
    try:
        doc = msgspec.msgpack.decode(body)
    except (msgspec.DecodeError, ValueError, RecursionError):
        print(f"{len(body)} bytes that do not decode as MessagePack")
        return 0
    print(json.dumps(doc, indent=2, default=repr))
    return 0
