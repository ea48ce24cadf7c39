"""Ed25519 keys: the node-self key (created on first start) and operator participant keys.

A key is named by its ``key/id``: ``ed25519:`` and the first 16 hex digits of the
SHA-256 of its public key. Private keys are files of mode 0600 under ``keys/``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec
from nacl.signing import SigningKey, VerifyKey

from sensorium.shared.paths import StatePaths

NODE_KEY = "node.key"
NODE_PUB = "node.pub"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def key_id(verify_key: VerifyKey) -> str:
    return "ed25519:" + hashlib.sha256(bytes(verify_key)).hexdigest()[:16]


@dataclass(frozen=True)
class KeyPair:
    signing_key: SigningKey
    participant_id: str | None = None

    @property
    def verify_key(self) -> VerifyKey:
        return self.signing_key.verify_key

    @property
    def key_id(self) -> str:
        return key_id(self.verify_key)

    @property
    def public_key(self) -> str:
        return b64url(bytes(self.verify_key))

    def __repr__(self) -> str:  # never the private half
        return f"<KeyPair {self.key_id} participant={self.participant_id}>"


def _write_private(path: Path, seed: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, seed)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_private(path: Path) -> SigningKey:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"{path} is mode {mode:o}; a private key must be 0600")
    seed = path.read_bytes()
    if len(seed) != 32:
        raise ValueError(f"{path} is not a 32-byte Ed25519 seed")
    return SigningKey(seed)


def node_key(paths: StatePaths, *, create: bool = True) -> KeyPair | None:
    """The node-self key, made on first use (mode 0600); None if absent and not created."""
    path = paths.keys / NODE_KEY
    if not path.exists():
        if not create:
            return None
        try:
            seed = SigningKey.generate()
            _write_private(path, bytes(seed))
            _write_public(paths.keys / NODE_PUB, seed.verify_key)
        except FileExistsError:
            pass  # another process made it first; read theirs
    pair = KeyPair(_read_private(path))
    if not (paths.keys / NODE_PUB).exists():
        _write_public(paths.keys / NODE_PUB, pair.verify_key)
    return pair


def node_public_key(paths: StatePaths) -> VerifyKey | None:
    """The node key's public half, for verifying: never needs (or reads) the private key."""
    try:
        return VerifyKey(unb64url((paths.keys / NODE_PUB).read_text().strip()))
    except (OSError, ValueError, TypeError):
        return None


def _write_public(path: Path, key: VerifyKey) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(b64url(bytes(key)) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def node_id(pair: KeyPair) -> str:
    return f"node:{pair.key_id}"


class OperatorKeyFile(msgspec.Struct, frozen=True, kw_only=True):
    participant_id: str = msgspec.field(name="participant/id")
    key_id: str = msgspec.field(name="key/id")
    public_key: str


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:64]


def new_operator_key(paths: StatePaths, participant_id: str) -> tuple[KeyPair, Path]:
    """A fresh operator key; its private half in ``keys/operators/`` (0600)."""
    pair = KeyPair(SigningKey.generate(), participant_id)
    stem = paths.keys / "operators" / f"{_slug(participant_id)}-{pair.key_id[8:]}"
    _write_private(stem.with_suffix(".key"), bytes(pair.signing_key))
    meta = OperatorKeyFile(
        participant_id=participant_id, key_id=pair.key_id, public_key=pair.public_key
    )
    stem.with_suffix(".pub.json").write_bytes(msgspec.json.encode(meta) + b"\n")
    return pair, stem.with_suffix(".key")


def load_operator_key(path: Path) -> KeyPair:
    """An operator key from its ``.key`` file; the ``.pub.json`` beside it names its owner."""
    meta = msgspec.json.decode(path.with_suffix(".pub.json").read_bytes(), type=OperatorKeyFile)
    pair = KeyPair(_read_private(path), meta.participant_id)
    if pair.key_id != meta.key_id:
        raise ValueError(f"{path} does not match the key/id in its .pub.json")
    return pair


def operator_keys(paths: StatePaths) -> list[Path]:
    d = paths.keys / "operators"
    return sorted(d.glob("*.key")) if d.is_dir() else []


def trust_signer(paths: StatePaths, pair: KeyPair) -> None:
    """Add an operator key to ``trusted_signers`` in ``config/node.json`` (kept otherwise)."""
    path = paths.node_config
    doc = json.loads(path.read_text()) if path.exists() else {}
    entry = {
        "participant/id": pair.participant_id,
        "key/id": pair.key_id,
        "public_key": pair.public_key,
    }
    signers = [s for s in doc.get("trusted_signers", []) if s.get("key/id") != pair.key_id]
    doc["trusted_signers"] = [*signers, entry]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
