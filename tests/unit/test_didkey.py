"""did:key for Ed25519 (shared/didkey.py) against the did:key spec's own test vectors."""

from __future__ import annotations

import pytest
from nacl.signing import SigningKey

from sensorium.shared.didkey import (
    DidKeyError,
    b58decode,
    b58encode,
    did_key,
    participant_id,
    public_key,
)

# did:key method spec (w3c-ccg/did-method-key), Ed25519 test vectors: the DID and the
# same key as publicKeyBase58 (raw 32 bytes in base58btc, no multicodec).
VECTORS = [
    (
        "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp",
        "4zvwRjXUKGfvwnParsHAS3HuSVzV5cA4McphgmoCtajS",
    ),
    (
        "did:key:z6MkpTHR8VNsBxYAAWHut2Geadd9jSwuBV8xRoAnwWsdvktH",
        "B12NYF8RrR3h41TDCTJojY59usg3mbtbjnFs7Eud1Y6u",
    ),
]


@pytest.mark.parametrize(("did", "base58"), VECTORS)
def test_spec_vectors_decode_and_encode_back(did: str, base58: str) -> None:
    key = public_key(did)
    assert len(key) == 32 and b58encode(key) == base58 and b58decode(base58) == key
    assert did_key(key) == did
    assert public_key(participant_id(did)) == key  # participant:did:key names the same key


def test_base58_keeps_leading_zero_bytes() -> None:
    for raw in (b"", b"\0", b"\0\0\x01", b"\xff" * 40, bytes(range(34))):
        assert b58decode(b58encode(raw)) == raw
    assert b58encode(b"\0\0\x01") == "112"


def test_generated_keys_round_trip() -> None:
    for _ in range(20):
        key = bytes(SigningKey.generate().verify_key)
        did = did_key(key)
        assert did.startswith("did:key:z6Mk") and public_key(did) == key


def test_participant_id_normalizes_once() -> None:
    did = VECTORS[0][0]
    assert participant_id(did) == "participant:" + did
    assert participant_id(participant_id(did)) == "participant:" + did


@pytest.mark.parametrize(
    "bad",
    [
        "did:web:example.com",
        "did:key:",
        "did:key:m6MkiTBz",  # multibase other than base58btc
        "did:key:z0OIl",  # not base58btc characters
        "did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme",  # secp256k1-pub
        "did:key:z6Mk",  # too short for a key
        "did:key:z" + "2" * 200,  # far too long
    ],
)
def test_what_is_not_an_ed25519_did_key_is_refused(bad: str) -> None:
    with pytest.raises(DidKeyError):
        public_key(bad)
