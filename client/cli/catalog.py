"""Review and authorize the OS connector's catalog: show, diff, sign, verify, validate.

  sensorium catalog show            the effective configuration, its hash, each action's source
  sensorium catalog diff            what changed since the signed version
  sensorium catalog sign [--yes]    show hash and diff, ask, sign with your operator key
                                    (seed 048's form; --form sensorium-wrapper.v1 for the
                                    extension that also binds domain, connector and signer)
  sensorium catalog verify          does the sidecar authorize what is on disk? (exit 0 if so)
  sensorium catalog validate FILE   lint a catalog file before installing it

Editing stays a text-file operation: the drop-ins in config/connectors/sensorium-os.d/.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

from sensorium.connectors.os.catalog import authorization as auth
from sensorium.connectors.os.catalog import sources as catalog_mod
from sensorium.shared.config import load_node_config
from sensorium.shared.keys import load_operator_key, operator_keys
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.wire.signature import SIGNATURE_FORMS


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="catalog_command", required=True, metavar="SUBCOMMAND")
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state-dir", default=argparse.SUPPRESS, help="state directory")
    show = sub.add_parser("show", parents=[state], help="the effective configuration and its hash")
    show.add_argument("--json", action="store_true", help="print the effective config as JSON")
    sub.add_parser("diff", parents=[state], help="what changed since the signed version")
    sign = sub.add_parser("sign", parents=[state], help="sign the effective configuration")
    sign.add_argument("--key", help="operator key file (default: the only one in keys/operators)")
    sign.add_argument("--yes", action="store_true", help="do not ask (headless use)")
    sign.add_argument(
        "--form",
        choices=SIGNATURE_FORMS,
        default="config-hash",
        help="what the signature covers: the seed's config-hash (default) or the "
        "sensorium-wrapper.v1 extension (also binds domain, connector, time, signer)",
    )
    sub.add_parser("verify", parents=[state], help="check the sidecar against the files on disk")
    validate = sub.add_parser("validate", parents=[state], help="lint a catalog file offline")
    validate.add_argument("file")


def _paths(args: argparse.Namespace) -> StatePaths:
    return StatePaths(resolve_state_dir(args.state_dir))


def _pretty(config: dict[str, Any]) -> list[str]:
    return json.dumps(config, indent=2, sort_keys=True).splitlines(keepends=True)


def _diff(paths: StatePaths, cat: catalog_mod.Catalog) -> tuple[str, list[str]]:
    """What changed since the configuration the current sidecar signs (or, when that is
    not on this node, since the factory defaults), and which base was used."""
    before = auth.signed_config(paths)
    label = "signed"
    if before is None:
        label = "factory defaults (the signed configuration is not on this node)"
        before = catalog_mod.merge([("factory", catalog_mod.factory_text())], []).config
    return label, list(
        difflib.unified_diff(_pretty(before), _pretty(cat.config), label, "effective")
    )


def _problems(cat: catalog_mod.Catalog) -> int:
    for p in cat.problems:
        print(f"  ✗ {p}" + (f"  [{p.code}]" if p.code else ""))
    return len(cat.problems)


def run(args: argparse.Namespace) -> int:
    handler = {
        "show": _show,
        "diff": _run_diff,
        "sign": _sign,
        "verify": _verify,
        "validate": _validate,
    }[args.catalog_command]
    return handler(args)


def _show(args: argparse.Namespace) -> int:
    paths = _paths(args)
    cat = catalog_mod.load(paths, materialize_defaults=False)
    if args.json:
        print(json.dumps(cat.config, indent=2, sort_keys=True))
        return 0
    verdict = auth.verify(paths, load_node_config(paths), cat.config_hash)
    print(f"effective configuration sha-256 {cat.config_hash}")
    print(f"authorization: {verdict.reason} — {verdict.message}")
    for aid in sorted(cat.sources):
        decl = cat.declarations.get(aid)
        kind = decl.class_ if decl else "INVALID"
        print(f"  {aid:<32} {kind:<22} from {cat.sources[aid]}")
        if (pin := cat.pins.get(aid)) is not None:
            print(f"    interpreter pinned at load: {pin}")
    return 1 if _problems(cat) else 0


def _run_diff(args: argparse.Namespace) -> int:
    paths = _paths(args)
    label, lines = _diff(paths, catalog_mod.load(paths, materialize_defaults=False))
    sys.stdout.writelines(lines or [f"no change since the {label} version\n"])
    return 0


def _sign(args: argparse.Namespace) -> int:
    paths = _paths(args)
    cat = catalog_mod.load(paths, materialize_defaults=False)
    if _problems(cat):
        print("refusing to sign a catalog that does not validate")
        return 1
    if args.key:
        key_file = Path(args.key)
    else:
        keys = operator_keys(paths)
        if len(keys) != 1:
            print(
                f"found {len(keys)} operator keys in {paths.keys / 'operators'}; name one with "
                "--key (make one with `sensorium keys new --participant ID --trust`)"
            )
            return 1
        key_file = keys[0]
    pair = load_operator_key(key_file)
    label, lines = _diff(paths, cat)
    print(f"changes since the {label} version:")
    sys.stdout.writelines(lines or ["  (none)\n"])
    print(f"\neffective configuration sha-256 {cat.config_hash}")
    for aid, pin in sorted(cat.pins.items()):
        print(f"{aid}: interpreter pinned at load: {pin}")
    print(f"signer {pair.participant_id} ({pair.key_id})")
    if not args.yes:
        if not sys.stdin.isatty():
            print("not a terminal: pass --yes to sign without asking")
            return 1
        if input("sign this configuration? [y/N] ").strip().lower() not in ("y", "yes"):
            print("not signed")
            return 1
    cfg = load_node_config(paths)
    try:
        # Exactly what was shown is signed; an edit made meanwhile is not covered by it.
        auth.sign_catalog(paths, cfg, cat, pair, args.form)
    except ValueError as exc:
        print(f"not signed: {exc}")
        return 1
    verdict = auth.verify(paths, cfg, cat.config_hash)
    print(f"wrote {auth.sidecar_path(paths)}: {verdict.reason} — {verdict.message}")
    if not verdict.authorized:
        return 1
    now = catalog_mod.load(paths, materialize_defaults=False)
    if now.config_hash != cat.config_hash:
        print(
            "the catalog changed on disk while you reviewed it: what you signed is not what "
            "is there now; review and sign again"
        )
        return 1
    print("restart the connector to load it: `sensorium restart connector`")
    return 0


def _verify(args: argparse.Namespace) -> int:
    paths = _paths(args)
    cat = catalog_mod.load(paths, materialize_defaults=False)
    if _problems(cat):
        print("the catalog on disk does not validate; the connector will refuse it")
        return 1
    if not auth.sidecar_path(paths).exists() and not catalog_mod.operator_file(paths).exists():
        print(
            "missing: nothing signed yet — the first start signs the untouched factory "
            "catalog with the node key"
        )
        return 1
    verdict = auth.verify(paths, load_node_config(paths), cat.config_hash)
    print(f"{verdict.reason}: {verdict.message}")
    return 0 if verdict.authorized else 1


def _validate(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        print(f"cannot read {path}: {exc.strerror}")
        return 1
    cat = catalog_mod.merge([(str(path), raw)], [])
    if _problems(cat):
        return 1
    print(f"{path}: {len(cat.declarations)} declarations, all valid")
    return 0
