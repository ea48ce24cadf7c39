"""Signed directives for tests: real Ed25519 keys (pynacl), did:key, RFC 8785 payloads.

Built the way a 045/032 signer would, independently of core/authenticity.py's own
payload functions, so a test that passes says the two agree on what is signed.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import rfc8785
from nacl.signing import SigningKey

from sensorium.shared.clock import rfc3339
from sensorium.shared.didkey import did_key
from sensorium.shared.ids import new_id


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass(frozen=True)
class Signer:
    key: SigningKey = field(default_factory=SigningKey.generate)

    @property
    def did(self) -> str:
        return did_key(bytes(self.key.verify_key))

    @property
    def participant(self) -> str:
        return "participant:" + self.did

    def sign(self, payload: bytes) -> str:
        return b64url(self.key.sign(payload).signature)


def directive(action_id: str, issuer: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An unsigned ``sensorium-directive.v1`` document."""
    return {
        "schema": "sensorium-directive.v1",
        "schema/v": 1,
        "directive/id": new_id(),
        "directive/issued_at": rfc3339(),
        "issuer": issuer,
        "action_id": action_id,
        "parameters": {},
        "timing": {"timeout_ms": 10_000, "mode": "sync"},
        **extra,
    }


def delegation(
    principal: Signer,
    proxy: Signer,
    grants: dict[str, list[str]],
    expires_in_s: float = 3600,
    **extra: Any,
) -> dict[str, Any]:
    """A compact DelegationProof signed by ``principal`` over its five fields."""
    proof: dict[str, Any] = {
        "delegation_id": f"delegation:key:{time.time_ns()}:{new_id()[-6:]}",
        "proxy_key": proxy.did,
        "principal_key": principal.did,
        "grants": grants,
        "expires_at": rfc3339(time.time() + expires_in_s),
    }
    proof["principal_signature"] = principal.sign(rfc8785.dumps(proof))
    return {**proof, **extra}


def signed(doc: dict[str, Any], signer: Signer) -> dict[str, Any]:
    """``doc`` with its ``signature``: over the JCS of everything but the signature and
    the delegation proof."""
    body = {k: v for k, v in doc.items() if k not in ("signature", "issuer_delegation")}
    return {**doc, "signature": {"alg": "ed25519", "value": signer.sign(rfc8785.dumps(body))}}
