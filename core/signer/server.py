"""``run/signer.sock``: where the actions' helpers ask core's signer, one JSON line each.

Only the node's own processes can reach the socket (``run/`` is 0700); the connector
connects for each directive with a grant, binds the connection to the grant with one
line (``protocol.BIND``, no answer) and hands the action that connection. What comes
over it is untrusted: a request is answered only under a live grant whose token it
carries, within its domains and count. A channel the connector did not bind is bound
to the first token it presents. A grant's channels are closed when it ends, and a
channel is closed after ``MAX_REFUSALS`` refusals: each refusal costs a durable audit
row, so an action may not buy an unbounded number of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import msgspec
import structlog

from sensorium.core.audit import AuditStore
from sensorium.core.signer import events
from sensorium.core.signer.events import SignerEvent
from sensorium.core.signer.grants import Grant, Grants, Refusal, token_digest
from sensorium.core.signer.keys import SignerKeys
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePaths
from sensorium.shared.signer.protocol import BIND, MAX_LINE, SOCKET_NAME, b64url, signed_bytes
from sensorium.shared.wire.declaration import Signing
from sensorium.shared.wire.outcome import Outcome, SignatureGiven

log = structlog.get_logger("sensorium.signer")
# Channels open at once (one per running directive with a grant, at most).
MAX_CHANNELS = 256
# Refusals one channel is answered (and audited) before it is closed: an honest helper
# meets one or two (a domain not granted, a count used up), never a stream of them.
MAX_REFUSALS = 4


@dataclass
class Channel:
    # The digest of the one token this channel may use (None until bound).
    bound: str | None = None
    refusals: int = 0


def _bind_token(line: bytes) -> str | None:
    """The token a bind line names (None: not a bind line)."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    token = msg.get(BIND) if isinstance(msg, dict) else None
    return token if isinstance(token, str) and token else None


class Signer:
    """The host signer boundary, as core's service uses it."""

    def __init__(self, paths: StatePaths, audit: AuditStore) -> None:
        self.path: Path = paths.run / SOCKET_NAME
        self.audit = audit
        self.keys = SignerKeys(paths)
        self.grants = Grants()
        self._server: asyncio.Server | None = None
        # Open channels, each with the token digest it is bound to.
        self._channels: dict[asyncio.StreamWriter, Channel] = {}

    def __repr__(self) -> str:
        return f"<Signer {self.grants!r} channels={len(self._channels)}>"

    async def start(self) -> None:
        """Listen; a signer that cannot start leaves core up (an action with ``signing``
        then fails to start: the connector cannot connect), and says why."""
        try:
            await self.audit.record(events.create)
            self.path.unlink(missing_ok=True)
            self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_LINE)
            os.chmod(self.path, 0o600)
        except (OSError, CodedError) as exc:
            log.error("signer.unavailable", error=str(exc), socket=str(self.path))

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._channels):
            writer.close()
        self._channels.clear()
        self.path.unlink(missing_ok=True)

    # -- grants: from core's dispatch --------------------------------------

    def issue(
        self, grant_id: str, directive_id: str, action_id: str, signing: Signing, lifetime_s: float
    ) -> str:
        """The one grant of a dispatch (``grant_id``: its seam request id); its token."""
        token = self.grants.issue(grant_id, directive_id, action_id, signing, lifetime_s)
        self.audit.enqueue(
            SignerEvent(
                "issued",
                directive_id,
                action_id,
                message=f"domains {sorted(signing.allowed_domains)}, "
                f"max_signatures {signing.max_signatures}, key_ref {signing.key_ref.get('kind')}",
            )
        )
        return token

    def end(self, grant_id: str, outcome: Outcome | None = None) -> Outcome | None:
        """Revoke the dispatch's grant, close its channels, and put what it signed on
        the outcome (``signatures``, possibly empty)."""
        ended = self.grants.end(grant_id)
        if ended is None:
            return outcome
        digest, grant = ended
        for writer, channel in list(self._channels.items()):
            if channel.bound == digest:
                writer.close()
                self._channels.pop(writer, None)
        self.audit.enqueue(
            SignerEvent(
                "ended", grant.directive_id, grant.action_id, message=f"{len(grant.given)} signed"
            )
        )
        if outcome is None:
            return None
        return msgspec.structs.replace(outcome, signatures=list(grant.given))

    # -- the channel ---------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._channels) >= MAX_CHANNELS:
            writer.close()
            return
        channel = self._channels[writer] = Channel()
        try:
            first = True
            while line := await reader.readline():
                bind = _bind_token(line) if first else None
                first = False
                if bind is not None:
                    # The connector's bind: no answer (the action's helper reads only its
                    # own); a grant not live (already ended) closes the channel at once.
                    channel.bound = token_digest(bind)
                    if channel.bound not in self.grants.live:
                        break
                    continue
                reply = await self._answer(line, channel)
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
                if channel.refusals >= MAX_REFUSALS:
                    await self._closed(channel)
                    break
        except (ValueError, ConnectionError, asyncio.IncompleteReadError):
            pass  # an overlong line, or the action went away: the channel ends
        finally:
            self._channels.pop(writer, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, line: bytes, channel: Channel) -> dict[str, object]:
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError:
            req = {}
        domain, digest, token = req.get("domain"), req.get("payload/sha256"), req.get("token")
        if channel.bound is None and isinstance(token, str) and token:
            # Bound by its first token whatever it names: no second guess at a live one.
            channel.bound = token_digest(token)
        got = self.grants.admit(token, domain, digest, channel.bound)
        if isinstance(got, Refusal):
            await self._refused(got, domain, digest, channel)
            return {"ok": False, "code": got.code.value, "message": got.message}
        return await self._sign(got[1], str(domain), str(digest), channel)

    async def _sign(
        self, grant: Grant, domain: str, digest: str, channel: Channel
    ) -> dict[str, object]:
        try:
            pair = self.keys.key_for(grant.key_ref)
        except (OSError, ValueError) as exc:
            refusal = Refusal(
                RuntimeErrorCode.SIGNER_UNAVAILABLE,
                f"the grant's key cannot be used: {exc}",
                grant.directive_id,
                grant.action_id,
            )
            await self._refused(refusal, domain, digest, channel)
            return {"ok": False, "code": refusal.code.value, "message": refusal.message}
        signature = b64url(pair.signing_key.sign(signed_bytes(domain, digest)).signature)
        given = SignatureGiven(
            domain=domain, payload_sha256=digest, key_id=pair.key_id, signature=signature
        )
        try:  # on disk before the action holds it
            await self.audit.record(
                SignerEvent(
                    "signed",
                    grant.directive_id,
                    grant.action_id,
                    domain=domain,
                    payload_sha256=digest,
                    key_id=pair.key_id,
                )
            )
        except CodedError as exc:
            grant.remaining += 1
            return {"ok": False, "code": exc.code, "message": exc.message}
        grant.given.append(given)
        log.info(
            "signer.signed",
            action_id=grant.action_id,
            domain=domain,
            key_id=pair.key_id,
            **{"directive/id": grant.directive_id},
        )
        return {
            "ok": True,
            "domain": domain,
            "payload/sha256": digest,
            "key/id": pair.key_id,
            "signature": signature,
        }

    async def _refused(self, r: Refusal, domain: object, digest: object, channel: Channel) -> None:
        channel.refusals += 1
        log.warning(
            "signer.refused",
            code=r.code.value,
            reason=r.message,
            action_id=r.action_id,
            **{"directive/id": r.directive_id},
        )
        with contextlib.suppress(CodedError):
            await self.audit.record(
                SignerEvent(
                    "refused",
                    r.directive_id,
                    r.action_id,
                    code=r.code.value,
                    domain=None if domain is None else str(domain),
                    payload_sha256=None if digest is None else str(digest),
                    message=r.message,
                )
            )

    async def _closed(self, channel: Channel) -> None:
        """The one record of a channel closed for its refusals (its last word audited)."""
        did: str | None = None
        aid: str | None = None
        if channel.bound is not None:
            grant = self.grants.live.get(channel.bound)
            if grant is not None:
                did, aid = grant.directive_id, grant.action_id
            elif channel.bound in self.grants.ended:
                did, aid = self.grants.ended[channel.bound]
        message = f"channel closed: too many refusals ({channel.refusals})"
        log.warning("signer.channel.closed", reason=message, action_id=aid, **{"directive/id": did})
        with contextlib.suppress(CodedError):
            await self.audit.record(SignerEvent("closed", did, aid, message=message))
