"""The keys the host signer signs with, by ``key_ref.kind``; never leave core.

* ``primary-participant``: the node-self key (``keys/node.key``), the node's identity.
* ``proxy``: a key of its own (``keys/signer/proxy.key``, made on first use), so
  what actions sign can be told apart from, and revoked without, the node's identity.
* ``derived``: HMAC-SHA256(node seed, ``sensorium-derived-key.v1`` 0x00 label) as an
  Ed25519 seed: one stable key per label, nothing more on disk.

Each key's public half is written to ``keys/signer/public/<key id hex>.pub`` (base64url)
so ``sensorium verify-signature`` can find it by the key id a signature names.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from sensorium.shared.keys import KeyPair, _read_private, _write_private, b64url, node_key
from sensorium.shared.paths import StatePaths

DERIVE_PREFIX = b"sensorium-derived-key.v1\x00"


def public_dir(paths: StatePaths) -> Path:
    return paths.keys / "signer" / "public"


class SignerKeys:
    def __init__(self, paths: StatePaths) -> None:
        self.paths = paths
        self._cache: dict[tuple[str, str], KeyPair] = {}

    def __repr__(self) -> str:  # never a key
        return f"<SignerKeys {len(self._cache)} loaded>"

    def key_for(self, key_ref: dict[str, Any]) -> KeyPair:
        kind = str(key_ref.get("kind"))
        label = str(key_ref.get("label", ""))
        cached = self._cache.get((kind, label))
        if cached is not None:
            return cached
        node = node_key(self.paths)
        assert node is not None
        if kind == "primary-participant":
            pair = node
        elif kind == "proxy":
            pair = KeyPair(self._proxy())
        elif kind == "derived" and label:
            seed = hmac.new(
                bytes(node.signing_key), DERIVE_PREFIX + label.encode(), hashlib.sha256
            ).digest()
            pair = KeyPair(SigningKey(seed))
        else:  # the catalog refuses these at load; never sign with a guess
            raise ValueError(f"no signing key for key_ref kind {kind!r}")
        self._publish(pair)
        self._cache[(kind, label)] = pair
        return pair

    def _proxy(self) -> SigningKey:
        path = self.paths.keys / "signer" / "proxy.key"
        if not path.exists():
            with contextlib.suppress(FileExistsError):
                _write_private(path, bytes(SigningKey.generate()))
        return _read_private(path)

    def _publish(self, pair: KeyPair) -> None:
        d = public_dir(self.paths)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{pair.key_id.removeprefix('ed25519:')}.pub"
        if path.exists():
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(b64url(bytes(pair.verify_key)) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
