"""The directive signature verifier (core/authenticity.py) with real Ed25519 keys."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import msgspec
import pytest
from signing import Signer, delegation, directive, signed

from sensorium.client.replay.plan import fresh
from sensorium.core.authenticity import (
    GRANT_TYPE,
    as_sent,
    grant_covers,
    signature_digest,
    verify,
)
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.server import PAYLOAD
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.directive import Directive

ACTION = "demo.system.uptime"


def _decode(doc: dict[str, Any]) -> Directive:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(doc), type=Directive)


def _code(doc: dict[str, Any], now: float | None = None) -> str | None:
    try:
        verify(_decode(doc), doc, now)
    except CodedError as exc:
        return exc.code
    return None


def _direct(alice: Signer, **extra: Any) -> dict[str, Any]:
    return signed(directive(ACTION, {"participant/did:key": alice.participant}, **extra), alice)


def _delegated(
    alice: Signer, proxy: Signer, grants: list[str] | None = None, **kw: Any
) -> dict[str, Any]:
    proof = delegation(alice, proxy, {GRANT_TYPE: grants or [ACTION]}, **kw)
    doc = directive(
        ACTION,
        {"participant/did:key": alice.participant, "module_id": "orbiplex.arca"},
        issuer_delegation=proof,
    )
    return signed(doc, proxy)


def test_unsigned_directives_pass_untouched() -> None:
    assert _code(directive(ACTION, {"module_id": "orbiplex.arca"})) is None


def test_a_direct_signature_verifies_and_has_a_digest() -> None:
    alice = Signer()
    doc = _direct(alice, **{"causal/context": {"parent": "a field unknown here"}})
    assert _code(doc) is None
    value = doc["signature"]["value"]
    raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    assert len(raw) == 64
    assert signature_digest(_decode(doc)) == f"sha256:{hashlib.sha256(raw).hexdigest()}"
    # The bare did:key form of the issuer is the same participant.
    bare = signed(directive(ACTION, {"participant/did:key": alice.did}), alice)
    assert _code(bare) is None


def test_the_payload_is_the_document_as_sent_not_the_decoded_struct() -> None:
    alice = Signer()
    doc = _direct(alice, **{"causal/context": {"parent": "x"}})
    d = _decode(doc)
    with pytest.raises(CodedError) as info:  # the Struct forgot causal/context
        verify(d, msgspec.to_builtins(d))
    assert info.value.code == RuntimeErrorCode.SIGNATURE_INVALID
    token = PAYLOAD.set(msgspec.msgpack.encode({"method": "x", "directive": doc}))
    try:
        assert as_sent(d) == doc
        verify(d)  # found in the request being handled
    finally:
        PAYLOAD.reset(token)
    other = _direct(alice)
    token = PAYLOAD.set(msgspec.msgpack.encode({"directive": other}))
    try:
        assert as_sent(d) != other  # another directive's bytes are never used
    finally:
        PAYLOAD.reset(token)


@pytest.mark.parametrize(
    ("tamper", "code"),
    [
        (lambda d: d["parameters"].update(x=1), RuntimeErrorCode.SIGNATURE_INVALID),
        (lambda d: d.update(action_id="demo.fs.stat"), RuntimeErrorCode.SIGNATURE_INVALID),
        (lambda d: d["timing"].update(timeout_ms=9), RuntimeErrorCode.SIGNATURE_INVALID),
        (lambda d: d.update(x_extra=True), RuntimeErrorCode.SIGNATURE_INVALID),
    ],
)
def test_a_tampered_payload_is_refused(tamper: Any, code: str) -> None:
    doc = _direct(Signer())
    tamper(doc)
    assert _code(doc) == code


def test_wrong_key_malformed_value_and_a_module_only_issuer() -> None:
    alice, mallory = Signer(), Signer()
    forged = signed(directive(ACTION, {"participant/did:key": alice.participant}), mallory)
    assert _code(forged) == RuntimeErrorCode.SIGNATURE_INVALID
    doc = _direct(alice)
    for value in ("c2lnbmF0dXJl", doc["signature"]["value"] + "+", "a" * 87 + "!"):
        bad = {**doc, "signature": {"alg": "ed25519", "value": value}}
        assert _code(bad) == RuntimeErrorCode.SIGNATURE_INVALID
    padded = {**doc, "signature": {"alg": "ed25519", "value": doc["signature"]["value"] + "=="}}
    assert _code(padded) is None
    module_only = signed(directive(ACTION, {"module_id": "orbiplex.arca"}), alice)
    assert _code(module_only) == RuntimeErrorCode.ISSUER_MISMATCH
    k256 = "did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme"
    not_ed25519 = signed(directive(ACTION, {"participant/did:key": k256}), alice)
    assert _code(not_ed25519) == RuntimeErrorCode.SIGNATURE_INVALID


def test_a_delegated_signature_verifies() -> None:
    alice, proxy = Signer(), Signer()
    assert _code(_delegated(alice, proxy)) is None
    assert _code(_delegated(alice, proxy, ["demo.*"])) is None
    assert _code(_delegated(alice, proxy, ["*"])) is None


def test_each_broken_delegation_has_its_code() -> None:
    alice, proxy, mallory = Signer(), Signer(), Signer()
    # Signed by the principal itself instead of the proxy key.
    doc = _delegated(alice, proxy)
    assert _code(signed(doc, alice)) == RuntimeErrorCode.SIGNATURE_INVALID
    # A proof whose grants were widened after the principal signed it.
    widened = _delegated(alice, proxy)
    widened["issuer_delegation"]["grants"] = {GRANT_TYPE: ["*"]}
    assert _code(signed(widened, proxy)) == RuntimeErrorCode.SIGNATURE_INVALID
    # A principal that is not the issuer.
    proof = delegation(mallory, proxy, {GRANT_TYPE: [ACTION]})
    other = directive(ACTION, {"participant/did:key": alice.participant}, issuer_delegation=proof)
    assert _code(signed(other, proxy)) == RuntimeErrorCode.ISSUER_MISMATCH
    # Expired by the node's clock.
    expired = _delegated(alice, proxy, expires_in_s=-1)
    assert _code(expired) == RuntimeErrorCode.DELEGATION_EXPIRED
    assert _code(_delegated(alice, proxy), now=time.time() + 7200) == (
        RuntimeErrorCode.DELEGATION_EXPIRED
    )
    # Grants that do not cover the action.
    narrow = _delegated(alice, proxy, ["demo.fs.*"])
    assert _code(narrow) == RuntimeErrorCode.DELEGATION_NOT_GRANTED
    foreign = _delegated(alice, proxy)
    foreign["issuer_delegation"] = delegation(alice, proxy, {"signing/capability": ["*"]})
    assert _code(signed(foreign, proxy)) == RuntimeErrorCode.DELEGATION_NOT_GRANTED


def test_a_chain_depth_above_zero_does_not_decode() -> None:
    alice, proxy = Signer(), Signer()
    deep = _delegated(alice, proxy, max_chain_depth=1)
    with pytest.raises(msgspec.ValidationError, match="max_chain_depth"):
        _decode(deep)
    assert _code(_delegated(alice, proxy, max_chain_depth=0)) is None


def test_grant_targets() -> None:
    grants = {GRANT_TYPE: ["demo.fs.*", "ops.echo"], "signing/capability": ["*"]}
    assert grant_covers(grants, "demo.fs.stat") and grant_covers(grants, "ops.echo")
    assert not grant_covers(grants, "demo.fsx") and not grant_covers(grants, "ops.echo2")
    assert not grant_covers({"signing/capability": ["*"]}, "ops.echo")


def test_a_digest_is_over_the_decoded_bytes() -> None:
    doc = _direct(Signer())
    value = doc["signature"]["value"]
    d = _decode(doc)
    twin = _decode({**doc, "signature": {"alg": "ed25519", "value": value + "=="}})
    assert signature_digest(d) == signature_digest(twin)
    assert signature_digest(_decode(directive(ACTION, {"module_id": "m"}))) is None


def test_a_replay_sends_a_signed_directive_unsigned() -> None:
    alice, proxy = Signer(), Signer()
    proof = delegation(alice, proxy, {GRANT_TYPE: [ACTION]})
    doc = signed(
        directive(ACTION, {"participant/did:key": alice.participant}, issuer_delegation=proof),
        proxy,
    )
    request = Invoke(request_id="r", directive=_decode(doc))
    replayed = fresh(request, "run", 0.0)
    assert isinstance(replayed, Invoke)
    d = replayed.directive
    assert d.signature is None and d.issuer_delegation is None
    assert d.directive_id != doc["directive/id"] and _code(msgspec.to_builtins(d)) is None
