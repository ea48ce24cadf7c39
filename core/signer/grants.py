"""The live scoped signer grants: one per dispatch, bounded in domains, count and time.

A grant is named by its dispatch's seam request id (fresh per dispatch: two callers'
colliding directive ids never share or block a grant) and found by its token's SHA-256
(the token itself is not kept). A channel is bound to one token's digest (server.py):
another grant's token on it is refused as ``signer-grant-unknown``. A grant past its
deadline refuses but stays live: only ``end`` (core's dispatch) ends it, so its end is
audited and what it gave reaches the outcome. An ended grant's digest is kept (bounded)
so a replay reads as ``signer-grant-ended`` in the audit, not as a forgery.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.signer.protocol import valid_digest, valid_domain
from sensorium.shared.wire.declaration import Signing
from sensorium.shared.wire.outcome import SignatureGiven

# Ended grants remembered to tell a replay from a forgery.
ENDED_KEPT = 4096


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Grant:
    directive_id: str
    action_id: str
    domains: frozenset[str]
    remaining: int
    expires_at: float  # time.monotonic()
    key_ref: dict[str, Any]
    given: list[SignatureGiven] = field(default_factory=list)


@dataclass(frozen=True)
class Refusal:
    code: RuntimeErrorCode
    message: str
    directive_id: str | None = None
    action_id: str | None = None

    def error(self) -> CodedError:
        return CodedError(self.code, self.message)


class Grants:
    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self.live: dict[str, Grant] = {}
        self._by_id: dict[str, str] = {}
        self.ended: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def __repr__(self) -> str:
        return f"<Grants live={len(self.live)} ended={len(self.ended)}>"

    def issue(
        self,
        grant_id: str,
        directive_id: str,
        action_id: str,
        signing: Signing,
        lifetime_s: float,
    ) -> str:
        """A fresh grant's token, named ``grant_id`` (its dispatch's seam request id)."""
        if grant_id in self._by_id:
            raise CodedError(
                RuntimeErrorCode.IDEMPOTENCY_CONFLICT,
                "this dispatch already holds a signer grant: it is running",
            )
        token = secrets.token_urlsafe(32)
        digest = token_digest(token)
        self.live[digest] = Grant(
            directive_id=directive_id,
            action_id=action_id,
            domains=frozenset(signing.allowed_domains),
            remaining=signing.max_signatures,
            expires_at=self._clock() + lifetime_s,
            key_ref=dict(signing.key_ref),
        )
        self._by_id[grant_id] = digest
        return token

    def end(self, grant_id: str) -> tuple[str, Grant] | None:
        """Revoke the grant; its digest and what it gave (None if there is none)."""
        digest = self._by_id.pop(grant_id, None)
        if digest is None:
            return None
        grant = self.live.pop(digest)
        self.ended[digest] = (grant.directive_id, grant.action_id)
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)
        return digest, grant

    def admit(
        self, token: object, domain: object, digest_hex: object, bound: str | None
    ) -> tuple[str, Grant] | Refusal:
        """The grant a request may use (its count already taken), or why not."""
        if not isinstance(token, str) or not token:
            return Refusal(RuntimeErrorCode.SIGNER_GRANT_UNKNOWN, "no grant token")
        key = token_digest(token)
        if key in self.ended:
            did, aid = self.ended[key]
            return Refusal(
                RuntimeErrorCode.SIGNER_GRANT_ENDED,
                "this grant's directive has ended; it signs nothing more",
                did,
                aid,
            )
        grant = self.live.get(key)
        if grant is None:
            return Refusal(RuntimeErrorCode.SIGNER_GRANT_UNKNOWN, "no grant has this token")
        if bound is not None and bound != key:
            return Refusal(
                RuntimeErrorCode.SIGNER_GRANT_UNKNOWN,
                "this channel belongs to another grant",
                grant.directive_id,
                grant.action_id,
            )
        if self._clock() > grant.expires_at:
            # Refused, not ended: its dispatch ends it, auditing that and what it gave.
            return Refusal(
                RuntimeErrorCode.SIGNER_GRANT_ENDED,
                "this grant's directive passed its deadline",
                grant.directive_id,
                grant.action_id,
            )
        if not valid_domain(domain) or not valid_digest(digest_hex):
            return Refusal(
                RuntimeErrorCode.REQUEST_MALFORMED,
                "a request names a domain tag and payload/sha256 (64 lowercase hex)",
                grant.directive_id,
                grant.action_id,
            )
        if domain not in grant.domains:
            return Refusal(
                RuntimeErrorCode.SIGNER_DOMAIN_REFUSED,
                f"{domain!r} is not among this action's signing.allowed_domains",
                grant.directive_id,
                grant.action_id,
            )
        if grant.remaining <= 0:
            return Refusal(
                RuntimeErrorCode.SIGNER_COUNT_EXHAUSTED,
                f"this grant's {len(grant.given)} signatures (max_signatures) are used",
                grant.directive_id,
                grant.action_id,
            )
        grant.remaining -= 1
        return key, grant
