"""Check what this host lets Sensorium enforce: every mechanism, every class, and the fix.

Builds real sandboxes (the connector's own canaries) in a throwaway directory, as
the user who runs it: run it as the user the node runs as (and with its limits: the
node's sandbox.* rlimits are checked against this process's hard limits). Exit status
0 when every action class can be enforced here, 1 when some cannot (each is named,
with why) or when no action could start (an rlimit above the hard limit).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from sensorium.connectors.os.envelope import doctor
from sensorium.connectors.os.envelope.probe import LANDLOCK_TIER_CLASSES, needs
from sensorium.shared.config import ConfigError, NodeConfig, load_node_config
from sensorium.shared.paths import StatePaths, resolve_state_dir

TIERS = {
    "namespaces": "every class runs in namespaces of its own, under Landlock and seccomp",
    "landlock": "no namespaces here: read-only classes run under Landlock and seccomp alone",
    "none": "no sandbox can be built here: no action runs",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def _node_config(state_dir: str | None) -> NodeConfig | None:
    """The node's node.json (its sandbox.* limits are checked); None: the defaults."""
    try:
        return load_node_config(StatePaths(resolve_state_dir(state_dir)))
    except ConfigError as exc:
        print(f"sensorium: {exc} (checking the defaults instead)", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    d = doctor.run(_node_config(getattr(args, "state_dir", None)))
    if args.json:
        print(json.dumps(dataclasses.asdict(d), indent=2))
        return 0 if d.healthy else 1
    print(f"tier: {d.tier} — {TIERS[d.tier]}\n")
    for c in d.checks:
        print(f"  {'ok ' if c.ok else 'NO '} {c.name}: {c.detail}")
        if c.fix:
            print(f"       fix: {c.fix}")
    print("\nclasses:")
    for cls, why in d.classes.items():
        print(f"  {'enabled    ' if why is None else 'unsupported'} {cls}")
        if why is None:
            continue
        if d.tier == "none":
            print("       no sandbox can be built here: see the checks above")
        elif d.tier == "landlock" and cls not in LANDLOCK_TIER_CLASSES:
            print(f"       needs {needs(cls)}: see the namespaces check above")
        else:
            print(f"       {why}")
    if d.healthy:
        print("\nEvery class can be enforced here.")
    else:
        print("\nActions of the classes above that are unsupported stay refused (never run")
        print("unenforced); `sensorium ledger` shows which of your actions that leaves out.")
    return 0 if d.healthy else 1
