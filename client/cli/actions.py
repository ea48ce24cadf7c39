"""List the actions this node's catalog offers, grouped, with their state.

An action runs only when its state is ``enabled`` or ``degraded``; a degraded one
lists the gaps in its envelope.
"""

from __future__ import annotations

import argparse
from itertools import groupby

import msgspec

from sensorium.client.api import Client


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the catalog view as JSON")
    parser.add_argument("--gaps", action="store_true", help="show each action's envelope gaps")


def run(args: argparse.Namespace) -> int:
    with Client(state_dir=args.state_dir) as client:
        view = client.describe()
    if args.json:
        print(msgspec.json.encode(view).decode())
        return 0
    if not view.actions:
        print(
            "no actions: the connector's catalog is empty, refused, or not reported yet "
            "(`sensorium catalog verify` and `sensorium catalog show` say why)"
        )
        return 1
    auth = "authorized" if view.config_authorized else "UNSIGNED (allow_unsigned_bootstrap)"
    print(f"catalog {view.config_hash[:16] if view.config_hash else '?'}… · {auth}")
    for group, items in groupby(view.actions, key=lambda a: a.group or "(no group)"):
        print(f"\n{group}")
        for a in items:
            props = a.parameters_schema.get("properties", {}) or {}
            required = set(a.parameters_schema.get("required", []) or [])
            params = " ".join(
                f"{k}{'' if k in required else '?'}:{v.get('type', 'any')}"
                for k, v in props.items()
                if isinstance(v, dict)
            )
            print(f"  {a.action_id:<28} {a.state:<10} {params}")
            if a.description:
                print(f"      {a.description}")
            if args.gaps:
                for gap in a.gaps:
                    print(f"      gap: {gap}")
    return 0
