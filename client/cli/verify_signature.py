"""Check one signature a scoped signer grant gave (``sensorium-sign``'s output).

sensorium verify-signature --signed SIG.json --payload FILE   the payload's bytes too
sensorium verify-signature --signed SIG.json                  against its payload/sha256
sensorium verify-signature --domain D --sha256 HEX --key-id K --signature S

The key is found by its key id among this node's (keys/node.pub, and the signer's
keys/signer/public/), or given with --public-key (base64url). Exit 0: valid; 1: not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from sensorium.core.signer.keys import public_dir
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.keys import key_id, node_public_key
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.signer.protocol import signed_bytes, unb64url


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--signed", type=Path, help="sensorium-sign's JSON output ('-': stdin)")
    p.add_argument("--payload", type=Path, help="the signed payload, checked against its digest")
    p.add_argument("--domain")
    p.add_argument("--sha256", help="the payload's SHA-256 (hex)")
    p.add_argument("--key-id")
    p.add_argument("--signature", help="base64url Ed25519 signature")
    p.add_argument("--public-key", help="base64url Ed25519 public key (default: by key id)")


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if args.signed is not None:
        text = sys.stdin.read() if str(args.signed) == "-" else args.signed.read_text()
        loaded = json.loads(text)
        if not isinstance(loaded, dict):
            raise ValueError("--signed: not a JSON object")
        doc.update(loaded)
    for name, value in (
        ("domain", args.domain),
        ("payload/sha256", args.sha256),
        ("key/id", args.key_id),
        ("signature", args.signature),
    ):
        if value is not None:
            doc[name] = value
    missing = [n for n in ("domain", "payload/sha256", "signature") if not doc.get(n)]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (give --signed or the flags)")
    return doc


def _key(paths: StatePaths, wanted: str | None, given: str | None) -> VerifyKey:
    if given is not None:
        return VerifyKey(unb64url(given))
    candidates = [k for k in [node_public_key(paths)] if k is not None]
    d = public_dir(paths)
    if d.is_dir():
        for pub in sorted(d.glob("*.pub")):
            candidates.append(VerifyKey(unb64url(pub.read_text().strip())))
    for k in candidates:
        if wanted is None or key_id(k) == wanted:
            return k
    raise CodedError(
        RuntimeErrorCode.SIGNATURE_INVALID,
        f"no key {wanted} on this node (give --public-key)",
    )


def run(args: argparse.Namespace) -> int:
    doc = _fields(args)
    digest = str(doc["payload/sha256"])
    if args.payload is not None:
        actual = hashlib.sha256(args.payload.read_bytes()).hexdigest()
        if actual != digest:
            raise CodedError(
                RuntimeErrorCode.SIGNATURE_INVALID,
                f"the payload's sha256 is {actual}, the signature is over {digest}",
            )
    paths = StatePaths(resolve_state_dir(args.state_dir))
    wanted = doc.get("key/id")
    key = _key(paths, str(wanted) if wanted else None, args.public_key)
    try:
        key.verify(signed_bytes(str(doc["domain"]), digest), unb64url(str(doc["signature"])))
    except (BadSignatureError, ValueError) as exc:
        raise CodedError(
            RuntimeErrorCode.SIGNATURE_INVALID,
            f"the signature does not verify under {key_id(key)} for domain {doc['domain']}",
        ) from exc
    checked = "payload checked" if args.payload is not None else "payload not given"
    print(f"valid: domain {doc['domain']}, key {key_id(key)}, sha256 {digest} ({checked})")
    return 0
