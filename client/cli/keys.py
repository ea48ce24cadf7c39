"""Manage signing keys: the node-self key and operator participant keys.

sensorium keys new --participant did:example:alice [--trust]
sensorium keys list
"""

from __future__ import annotations

import argparse
import json

import msgspec

from sensorium.shared.keys import (
    OperatorKeyFile,
    key_id,
    new_operator_key,
    node_public_key,
    operator_keys,
    trust_signer,
)
from sensorium.shared.paths import StatePaths, resolve_state_dir


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_command", required=True, metavar="SUBCOMMAND")
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state-dir", default=argparse.SUPPRESS, help="state directory")
    new = sub.add_parser("new", parents=[state], help="make an operator key")
    new.add_argument("--participant", required=True, help="the operator's participant id")
    new.add_argument(
        "--trust", action="store_true", help="also add it to trusted_signers in config/node.json"
    )
    sub.add_parser("list", parents=[state], help="the node key, operator keys and trusted signers")


def run(args: argparse.Namespace) -> int:
    paths = StatePaths(resolve_state_dir(args.state_dir))
    paths.ensure()
    if args.keys_command == "new":
        pair, path = new_operator_key(paths, args.participant)
        print(
            f"{pair.key_id}  {pair.participant_id}\n  private: {path} (0600)\n"
            f"  public:  {pair.public_key}"
        )
        if args.trust:
            trust_signer(paths, pair)
            print(f"  trusted in {paths.node_config}")
        return 0
    node = node_public_key(paths)
    print(f"node key: {key_id(node) if node else '(not made yet: created on first start)'}")
    for path in operator_keys(paths):
        try:  # the public half only: listing never needs a private key
            meta = msgspec.json.decode(
                path.with_suffix(".pub.json").read_bytes(), type=OperatorKeyFile
            )
            print(f"operator key: {meta.key_id}  {meta.participant_id}  {path}")
        except (OSError, msgspec.DecodeError) as exc:
            print(f"operator key: ?  ({path}: {exc})")
    doc = json.loads(paths.node_config.read_text()) if paths.node_config.exists() else {}
    for s in doc.get("trusted_signers", []):
        print(f"trusted signer: {s.get('key/id')}  {s.get('participant/id')}")
    return 0
