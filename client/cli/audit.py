"""Read the audit's outcome records: one per directive, rejections included.

  sensorium audit show ID      an outcome/id (the receipt `invoke` prints) or directive/id
  sensorium audit list [--action A] [--status S] [--issuer I] [--limit N] [--cursor C]

Restricted: the local operator, or a CURVE client granted `audit` by name.
"""

from __future__ import annotations

import argparse
import json
import sys

import msgspec

from sensorium.client.api import Client
from sensorium.client.cli.terminal import printable
from sensorium.shared.wire.audit import OutcomeRecord

STATUSES = ("admitted", "completed", "failed", "timed_out", "rejected")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="audit_command", required=True)
    show = sub.add_parser("show", help="one directive's outcome record")
    show.add_argument("id", help="outcome/id (outcome:… allowed) or directive/id")
    show.add_argument("--json", action="store_true", help="print the record as JSON")
    listing = sub.add_parser("list", help="outcome records, newest first")
    listing.add_argument("--action", help="only this action_id")
    listing.add_argument("--status", choices=STATUSES, help="only this outcome/status")
    listing.add_argument("--issuer", help="only this issuer (module_id or participant)")
    listing.add_argument("--since", help="recorded at or after (RFC 3339)")
    listing.add_argument("--until", help="recorded before (RFC 3339)")
    listing.add_argument("--limit", type=int, default=20, help="at most N (the node caps it)")
    listing.add_argument("--cursor", help="continue after a page (its next_cursor)")
    listing.add_argument("--json", action="store_true", help="print the page as JSON")


def run(args: argparse.Namespace) -> int:
    with Client(state_dir=args.state_dir) as client:
        if args.audit_command == "show":
            rec = client.audit_get(args.id)
            if args.json:
                print(msgspec.json.encode(rec).decode())
            else:
                show(rec)
            return 0
        page = client.audit_query(
            action_id=args.action,
            status=args.status,
            issuer=args.issuer,
            since=args.since,
            until=args.until,
            limit=max(1, args.limit),
            cursor=args.cursor,
        )
    if args.json:
        print(msgspec.json.encode(page).decode())
        return 0
    tty = sys.stdout.isatty()
    print(f"{'RECORDED':<25} {'STATUS':<10} {'ACTION':<28} {'ISSUER':<20} OUTCOME")
    for r in page.records:
        line = (
            f"{r.recorded_at:<25} {r.status:<10} {r.action_id[:28]:<28} "
            f"{r.issuer.name[:20]:<20} outcome:{r.outcome_id}"
        )
        print(printable(line, tty))
    if page.next_cursor is not None:
        print(f"more: sensorium audit list --cursor {page.next_cursor}")
    return 0


def show(rec: OutcomeRecord) -> None:
    tty = sys.stdout.isatty()
    lines = [
        f"{rec.status} · {rec.action_id} · outcome:{rec.outcome_id}",
        f"  directive {rec.directive_id} issued by {rec.issuer.name}",
        f"  recorded {rec.recorded_at} · {rec.retry_attempts} attempt(s)",
    ]
    if isinstance(rec.connector_id, str):
        lines.append(f"  connector {rec.connector_id} ({rec.connector_kind})")
    if isinstance(rec.duration_ms, int):
        lines.append(f"  duration {rec.duration_ms} ms")
    if rec.operation is not None:
        lines.append(f"  operation {rec.operation}")
    if rec.observation_ids:
        lines.append(f"  observations {', '.join(rec.observation_ids)}")
    if rec.result_summary:
        lines.append(f"  summary {json.dumps(rec.result_summary)}")
    lines += [f"  {d.code}: {d.message}" for d in rec.diagnostics]
    for line in lines:
        print(printable(line, tty))
