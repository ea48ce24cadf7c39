"""Manage keys: Ed25519 signing keys, and the CURVE keys of tcp endpoints.

sensorium keys new --participant did:example:alice [--trust]
sensorium keys list
sensorium keys curve init [--json]     make the node's CURVE pairs (existing ones kept)
sensorium keys curve show [--json]     their public keys (clients need the server's)
sensorium keys client add NAME [--grant X]... [--module ID]... [--public-key Z85]
sensorium keys client list [--json]
sensorium keys client grant NAME X...         add actions or groups to a client's grant
sensorium keys client ungrant NAME X...       take them out of it
sensorium keys client bind NAME ID...         add issuer module ids it may claim
sensorium keys client unbind NAME ID...       take them out (none left: its NAME only)
sensorium keys client revoke NAME             drop it from the allowlist

A grant X names actions: an action id (demo.fs.stat), PREFIX.* (every action id
under PREFIX., and the group PREFIX and its subgroups), a GROUP (the actions that
declare it), or * (every action). add and grant refuse an X that matches no action
and no group of the catalog (the signed one, read offline from the state dir; before
anything is signed, the one on disk), listing what it holds. Changes hold from a
client's next request.
--module binds the key to the issuer.module_id values its directives may claim
('*': any); a key bound to none may claim only its own NAME.
The grant `audit`, given by name (never implied by *), lets a key read the outcome
records (sensorium.audit.get / .query, `sensorium audit`).
"""

from __future__ import annotations

import argparse
import json

import msgspec

from sensorium.connectors.os.catalog import authorization as auth
from sensorium.connectors.os.catalog import sources as catalog_mod
from sensorium.core.auditread import AUDIT_GRANT
from sensorium.core.grants import matches
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.keys import (
    OperatorKeyFile,
    key_id,
    new_operator_key,
    node_public_key,
    operator_keys,
    trust_signer,
)
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.rpc.curvekeys import (
    ALL_GROUPS,
    ROLES,
    SERVER,
    ClientEntry,
    CurveStore,
    fingerprint,
)

ROLE_TEXT = {
    "server": "core's tcp client API",
    "connector": "the connector seam's tcp endpoint",
    "core": "the node's own client key (core, poller, local CLI)",
}


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
    curve = sub.add_parser("curve", help="the node's CURVE key pairs (tcp endpoints)")
    csub = curve.add_subparsers(dest="curve_command", required=True, metavar="SUBCOMMAND")
    for verb, text in (("init", "make missing pairs"), ("show", "print public keys")):
        p = csub.add_parser(verb, parents=[state], help=text)
        p.add_argument("--json", action="store_true", help="print JSON")
    client = sub.add_parser("client", help="CURVE clients allowed on core's tcp endpoint")
    lsub = client.add_subparsers(dest="client_command", required=True, metavar="SUBCOMMAND")
    add = lsub.add_parser("add", parents=[state], help="allowlist a client key")
    add.add_argument("name", help="the client's name (A-Z a-z 0-9 . _ -)")
    add.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="X",
        help="an action id, PREFIX.*, or group it may invoke (repeat; '*' for all); "
        "none: reads only",
    )
    add.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="ID",
        help="an issuer.module_id its directives may claim (repeat; '*' for any); "
        "none: only NAME itself",
    )
    add.add_argument(
        "--public-key", help="the client's own public key (Z85); else a pair is made here"
    )
    lsub.add_parser("list", parents=[state], help="allowlisted clients").add_argument(
        "--json", action="store_true", help="print JSON"
    )
    for verb, text in (("grant", "add actions or groups"), ("ungrant", "remove them")):
        p = lsub.add_parser(verb, parents=[state], help=text)
        p.add_argument("name")
        p.add_argument("groups", nargs="+", metavar="X")
    for verb, text in (("bind", "add issuer modules"), ("unbind", "remove issuer modules")):
        p = lsub.add_parser(verb, parents=[state], help=text)
        p.add_argument("name")
        p.add_argument("modules", nargs="+", metavar="ID")
    lsub.add_parser("revoke", parents=[state], help="drop a client").add_argument("name")


def run(args: argparse.Namespace) -> int:
    paths = StatePaths(resolve_state_dir(args.state_dir))
    paths.ensure()
    if args.keys_command == "curve":
        return _curve(CurveStore(paths), args)
    if args.keys_command == "client":
        return _client(CurveStore(paths), args, paths)
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


def _curve(store: CurveStore, args: argparse.Namespace) -> int:
    if args.curve_command == "init":
        made = store.init()
    else:
        made = {r: (store.public(r), False) for r in ROLES if store.public_path(r).exists()}
        if not made:
            print(f"no CURVE keys in {store.root}; `sensorium keys curve init` makes them")
            return 1
    if args.json:
        doc = {
            r: {"public_key": k, "fingerprint": fingerprint(k), "made": m}
            for r, (k, m) in made.items()
        }
        print(json.dumps({"keys": doc}))
        return 0
    for role, (key, fresh) in made.items():
        state = "made" if fresh else "kept"
        print(f"{role:<10} {fingerprint(key)}  {key}  ({state}; {ROLE_TEXT[role]})")
    print(f"  secrets: {store.root}/*.key_secret (0600)")
    return 0


def _entry_json(e: ClientEntry) -> dict[str, object]:
    return {
        "name": e.name,
        "public_key": e.public_key,
        "fingerprint": e.fingerprint,
        "grants": list(e.grants),
        "modules": list(e.claims),
    }


MAX_LISTED = 40


def _catalog_names(paths: StatePaths) -> tuple[list[tuple[str, str | None]], str] | str:
    """Every (action id, group) of the catalog a grant is checked against, and where it
    was read; or why no catalog could be read."""
    config = auth.signed_config(paths)
    where = f"the signed catalog ({auth.sidecar_path(paths)})"
    if config is None:
        cat = catalog_mod.load(paths, materialize_defaults=False)
        if not cat.valid:
            return (
                f"no catalog can be read from {paths.root}: nothing signed is there and the "
                "catalog on disk does not validate (`sensorium catalog show` says why)"
            )
        config, where = cat.config, f"the catalog on disk in {paths.connectors_config}"
    entries = config.get("action_catalog")
    names: list[tuple[str, str | None]] = []
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and isinstance(e.get("action_id"), str):
            group = e.get("group")
            names.append((e["action_id"], group if isinstance(group, str) else None))
    return names, where


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED]) or "(none)"
    return shown + (f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")


def _refused_grants(paths: StatePaths, grants: list[str]) -> str | None:
    """Why some of ``grants`` may not be given (a name that matches nothing), or None."""
    asked = [g for g in grants if g not in (ALL_GROUPS, AUDIT_GRANT)]
    if not asked:
        return None
    found = _catalog_names(paths)
    if isinstance(found, str):
        return f"cannot check the grant {', '.join(asked)}: {found}"
    names, where = found
    unknown = [g for g in asked if not any(matches(g, a, grp) for a, grp in names)]
    if not unknown:
        return None
    groups = sorted({grp for _, grp in names if grp is not None})
    return (
        f"grant {', '.join(repr(g) for g in unknown)} matches no action and no group of "
        f"{where}.\n  groups:  {_listed(groups)}\n  actions: {_listed(sorted(a for a, _ in names))}"
        f"\n  (also 'PREFIX.*' of either, '*' for every action, '{AUDIT_GRANT}' to read the "
        "outcome records)"
    )


def _client(store: CurveStore, args: argparse.Namespace, paths: StatePaths) -> int:
    cmd = args.client_command
    if cmd in ("add", "grant"):
        refused = _refused_grants(paths, args.grant if cmd == "add" else args.groups)
        if refused is not None:
            raise CodedError(RuntimeErrorCode.GRANT_UNKNOWN, refused)
    if cmd == "add":
        if not store.has(*ROLES):
            store.init()  # the issued secret must name the server's key
        entry, issued = store.add_client(args.name, args.grant, args.public_key, args.module)
        _print_entry(entry)
        if issued is not None:
            print(
                f"  secret:  {issued} (0600; names the server key too). Hand it to the client "
                "over a secure channel, then delete it here.\n"
                f'  use:     Client(endpoint="tcp://HOST:PORT", curve=ClientKeys.load(PATH))'
            )
        else:
            print(f"  server key (for the client): {store.public(SERVER)}")
        return 0
    if cmd == "list":
        entries, problems = store.clients()
        server = store.public(SERVER) if store.public_path(SERVER).exists() else None
        if args.json:
            doc = {
                "server_key": server,
                "clients": [_entry_json(e) for e in entries],
                "problems": problems,
            }
            print(json.dumps(doc))
            return 0
        print(f"server key: {server or '(none: `sensorium keys curve init`)'}")
        for e in entries:
            _print_entry(e)
        for p in problems:
            print(f"unreadable: {p}")
        return 0
    if cmd == "revoke":
        if not store.revoke(args.name):
            raise CodedError(
                RuntimeErrorCode.CLIENT_UNKNOWN,
                f"no client {args.name}; `sensorium keys client list` shows the clients",
            )
        print(f"revoked {args.name}: refused from its next handshake or request")
        return 0
    if cmd in ("bind", "unbind"):
        bound = store.client(args.name).modules
        if cmd == "bind":
            modules = [*bound, *args.modules]
        else:
            modules = [m for m in bound if m not in args.modules]
        _print_entry(store.set_modules(args.name, modules))
        return 0
    current = store.client(args.name).grants
    if cmd == "grant":
        groups = [*current, *args.groups]
    else:
        groups = [g for g in current if g not in args.groups]
    _print_entry(store.set_grants(args.name, groups))
    return 0


def _print_entry(e: ClientEntry) -> None:
    print(f"client {e.name}  {e.fingerprint}  grants: {', '.join(e.grants) or '(reads only)'}")
    print(f"  issues as: {', '.join(e.claims)}{'' if e.modules else ' (its name: no --module)'}")
    print(f"  public:  {e.public_key}")
