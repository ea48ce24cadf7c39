"""Show the capability ledger: each action's effective state and the planes that agreed.

An action runs only when it is `enabled` or `degraded`; any other state names the
plane that said no (`blocked_by_policy`: the catalog's authorization, say).
"""

from __future__ import annotations

import argparse

import msgspec

from sensorium.client.api import Client


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action_id", nargs="?", help="only this action")
    parser.add_argument("--json", action="store_true", help="print the ledger as JSON")


def run(args: argparse.Namespace) -> int:
    with Client(state_dir=args.state_dir) as client:
        ledger = client.ledger(args.action_id)
    if args.json:
        print(msgspec.json.encode(ledger).decode())
        return 0
    print(f"{'ACTION':<32} {'STATE':<24} AGREED")
    for e in ledger.entries:
        action = e.capabilityRef.rsplit(":", 1)[-1]
        print(f"{action:<32} {e.effectiveState:<24} {','.join(e.negotiatedBy)}")
        for ref in e.evidenceRefs:
            if ref.startswith("authorization:") and not ref.endswith((":ok",)):
                print(f"    {ref}")
            elif ref.startswith("gap:") and e.effectiveState != "enabled":
                # Why it is not enabled, in the connector's words (and what to do).
                print(f"    {ref.removeprefix('gap:')}")
    if any(e.effectiveState == "unsupported_by_runtime" for e in ledger.entries):
        print("\nSome actions cannot be enforced here: `sensorium doctor` says what to change.")
    return 0
