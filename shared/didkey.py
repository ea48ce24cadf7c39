"""``did:key`` for Ed25519 keys: ``did:key:z`` + base58btc(0xed 0x01 + 32 key bytes).

The did:key method spec (W3C CCG): multibase prefix ``z`` is base58btc (the Bitcoin
alphabet), and the multicodec varint ``0xed 0x01`` names an ed25519-pub key. Proposal
045 names participants ``participant:did:key:z...`` and accepts a bare ``did:key:z...``
in local envelopes; both name the same key. No installed package decodes base58, and
the codec is a few lines, so it lives here (tests/unit/test_didkey.py checks it
against the spec's own test vectors).
"""

from __future__ import annotations

ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}
ED25519_PUB = b"\xed\x01"  # multicodec ed25519-pub, as an unsigned varint
DID_KEY = "did:key:"
PARTICIPANT = "participant:"
# A did:key of an Ed25519 key is 48 base58 characters; anything much longer is not one,
# and is refused before the quadratic conversion below runs on it.
MAX_ENCODED = 128


class DidKeyError(ValueError):
    """Not a did:key of an Ed25519 public key; the message says why."""


def b58encode(raw: bytes) -> str:
    n = int.from_bytes(raw, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = ALPHABET[r] + out
    zeros = len(raw) - len(raw.lstrip(b"\0"))
    return ALPHABET[0] * zeros + out


def b58decode(text: str) -> bytes:
    n = 0
    for c in text:
        i = _INDEX.get(c)
        if i is None:
            raise DidKeyError(f"{c!r} is not a base58btc character")
        n = n * 58 + i
    zeros = len(text) - len(text.lstrip(ALPHABET[0]))
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * zeros + body


def did_key(public_key: bytes) -> str:
    """The ``did:key`` of a 32-byte Ed25519 public key."""
    if len(public_key) != 32:
        raise DidKeyError(f"an Ed25519 public key is 32 bytes, not {len(public_key)}")
    return DID_KEY + "z" + b58encode(ED25519_PUB + public_key)


def participant_id(did: str) -> str:
    """``did`` in the canonical ``participant:did:key:z...`` form (045: verifiers
    normalize before comparing)."""
    return did if did.startswith(PARTICIPANT) else PARTICIPANT + did


def public_key(did: str) -> bytes:
    """The 32-byte Ed25519 key a ``did:key`` (or ``participant:did:key``) names."""
    bare = did.removeprefix(PARTICIPANT)
    if not bare.startswith(DID_KEY + "z"):
        raise DidKeyError(f"{did[:80]!r} is not a base58btc did:key (did:key:z...)")
    encoded = bare[len(DID_KEY) + 1 :]
    if not encoded or len(encoded) > MAX_ENCODED:
        raise DidKeyError(f"{did[:80]!r} is not the did:key of an Ed25519 key (its length)")
    raw = b58decode(encoded)
    if not raw.startswith(ED25519_PUB):
        raise DidKeyError(
            f"{did[:80]!r} is not an Ed25519 key: its multicodec is not ed25519-pub (0xed01)"
        )
    key = raw[len(ED25519_PUB) :]
    if len(key) != 32:
        raise DidKeyError(f"{did[:80]!r} holds {len(key)} key bytes; Ed25519 has 32")
    return key
