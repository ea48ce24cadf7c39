"""Signed directives against a live node (issue 24, item 2): a valid signature runs and
its outcome links to it; every broken one is refused with its code, audited, and
nothing is dispatched to the connector."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import apsw
import msgspec
import pytest
import zmq
from harness import Stack
from signing import Signer, delegation, directive, signed

from sensorium.client.endpoint import core_endpoint
from sensorium.core.authenticity import GRANT_TYPE
from sensorium.shared.ids import new_id
from sensorium.shared.keys import unb64url

INVOKE = "sensorium.directive.invoke"
ACTION = "test.echo-args"


def _call(stack: Stack, doc: dict[str, Any]) -> dict[str, Any]:
    """The directive as any language's client sends it: a DEALER and a MessagePack map."""
    request = {"method": INVOKE, "request/id": new_id(), "directive": doc}
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(core_endpoint(state_dir=str(stack.paths.root)))
        sock.send(msgspec.msgpack.encode(request))
        assert sock.poll(30_000), "no reply from core"
        reply: dict[str, Any] = msgspec.msgpack.decode(sock.recv())
    finally:
        sock.close()
    return reply


def _audit(stack: Stack, directive_id: str) -> tuple[list[tuple[str, str | None]], int]:
    """(kind, code) of its audit records, and how many dispatches it had."""
    with apsw.Connection(str(stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as db:
        rows = db.execute(
            "SELECT kind, code FROM records WHERE directive_id = ?", (directive_id,)
        ).fetchall()
        [(sent,)] = db.execute(
            "SELECT count(*) FROM dispatches WHERE directive_id = ?", (directive_id,)
        ).fetchall()
    return [(str(k), None if c is None else str(c)) for k, c in rows], int(sent)


def _refused_audited(stack: Stack, directive_id: str, code: str) -> None:
    for _ in range(200):  # a rejection is queued for the audit store; bounded by count
        records, sent = _audit(stack, directive_id)
        if records:
            break
        time.sleep(0.05)
    assert records == [("rejection", code)] and sent == 0, (records, sent)


def _echo(issuer: dict[str, Any], value: str, **extra: Any) -> dict[str, Any]:
    return directive(ACTION, issuer, **extra) | {"parameters": {"value": value}}


def test_signed_directives_run_or_are_refused_before_anything_runs(stack: Stack) -> None:
    alice, proxy, mallory = Signer(), Signer(), Signer()
    issuer = {"participant/did:key": alice.participant, "module_id": "orbiplex.arca"}

    # Valid, signed by the participant itself (with a field this node does not know).
    ok = signed(_echo(issuer, "direct", **{"causal/context": {"parent": "p-1"}}), alice)
    reply = _call(stack, ok)
    assert reply["ok"], reply["error"]
    result = reply["result"]
    assert result["status"] == "completed"
    assert json.loads(result["sensorium/outcome"]["stdout"]["text"]) == ["--", "direct"]
    raw = unb64url(ok["signature"]["value"])
    digest = f"sha256:{hashlib.sha256(raw).hexdigest()}"
    assert result["directive/signature_digest"] == digest
    assert result["sensorium/outcome"]["directive/signature_digest"] == digest
    records, sent = _audit(stack, ok["directive/id"])
    assert records == [("outcome", None)] and sent == 1
    with apsw.Connection(str(stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as db:
        [(body,)] = db.execute(
            "SELECT body FROM records WHERE directive_id = ?", (ok["directive/id"],)
        ).fetchall()
    assert msgspec.msgpack.decode(body)["directive/signature_digest"] == digest  # audited too
    unsigned = _call(stack, _echo({"module_id": "orbiplex.arca"}, "unsigned"))
    assert unsigned["ok"] and "directive/signature_digest" not in unsigned["result"]

    # Valid, signed by a proxy key under a delegation granting the action.
    proof = delegation(alice, proxy, {GRANT_TYPE: ["test.*"]})
    by_proxy = signed(_echo(issuer, "delegated", issuer_delegation=proof), proxy)
    reply = _call(stack, by_proxy)
    assert reply["ok"], reply["error"]
    assert reply["result"]["status"] == "completed"
    assert reply["result"]["directive/signature_digest"].startswith("sha256:")

    tampered = signed(_echo(issuer, "as signed"), alice)
    tampered["parameters"]["value"] = "as run"
    wrong_key = signed(_echo(issuer, "forged"), mallory)
    expired = signed(
        _echo(issuer, "late", issuer_delegation=delegation(alice, proxy, {GRANT_TYPE: ["*"]}, -5)),
        proxy,
    )
    narrow = delegation(alice, proxy, {GRANT_TYPE: ["demo.fs.*"]})
    not_granted = signed(_echo(issuer, "outside", issuer_delegation=narrow), proxy)
    impostor = delegation(mallory, proxy, {GRANT_TYPE: ["*"]})
    mismatched = signed(_echo(issuer, "impostor", issuer_delegation=impostor), proxy)
    cases = [
        (tampered, "signature-invalid", "$.signature.value"),
        (wrong_key, "signature-invalid", "$.signature.value"),
        (expired, "delegation-expired", "$.issuer_delegation.expires_at"),
        (not_granted, "delegation-not-granted", "$.issuer_delegation.grants"),
        (mismatched, "issuer-mismatch", "$.issuer_delegation.principal_key"),
    ]
    for doc, code, path in cases:
        reply = _call(stack, doc)
        # Refused at admission: a `rejected` directive result, coded, with its location.
        assert reply["ok"] and reply["result"]["status"] == "rejected", reply
        first = reply["result"]["diagnostics"][0]
        assert (first["code"], first["path"]) == (code, path), first
        _refused_audited(stack, doc["directive/id"], code)


@pytest.mark.parametrize("depth", [1, 2])
def test_a_delegation_chain_deeper_than_zero_is_refused_unread(stack: Stack, depth: int) -> None:
    alice, proxy = Signer(), Signer()
    issuer = {"participant/did:key": alice.participant}
    proof = delegation(alice, proxy, {GRANT_TYPE: ["*"]}, max_chain_depth=depth)
    doc = signed(_echo(issuer, "deep", issuer_delegation=proof), proxy)
    reply = _call(stack, doc)
    # The published schema's const 0: the request does not decode, so it never reaches
    # admission (no record, no dispatch).
    assert not reply["ok"] and reply["error"]["code"] == "request-malformed"
    assert "max_chain_depth" in reply["error"]["message"]
    assert _audit(stack, doc["directive/id"]) == ([], 0)
