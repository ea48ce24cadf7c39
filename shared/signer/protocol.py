"""The scoped signer grant's protocol (seed 048, the ``signing`` block).

Core holds the keys and listens on ``run/signer.sock``. For a directive whose
declaration has ``signing`` it registers one bounded grant and sends its token
with the dispatch; the connector connects to that socket, binds the connection to
the grant with one line ``{"bind": T}`` (unanswered: the channel then serves that
grant only, and is closed when it ends) and hands the action the connected socket
as an inherited fd, named with the token in the environment. It never reads what
passes over it.

One request is one JSON line, one reply is one JSON line::

    → {"token": T, "domain": "git.commit.v1", "payload/sha256": HEX}
    ← {"ok": true, "domain": …, "payload/sha256": …, "key/id": …, "signature": B64URL}
    ← {"ok": false, "code": "signer-domain-refused", "message": …}

The payload never leaves the action: only its SHA-256 does. The signature is Ed25519
over ``signed_bytes(domain, digest)``::

    b"sensorium-signed.v1" 0x00 domain(UTF-8) 0x00 sha256(payload)(32 raw bytes)

so a signature under one domain can never be presented as one under another, nor as
any other signature the node's keys make: those sign canonical JSON (it begins with
``{`` and never holds 0x00) or, a catalog sidecar's ``config-hash`` form, a raw 32-byte
SHA-256; these bytes begin with ``PREFIX`` 0x00 and are at least 55 bytes long.
"""

from __future__ import annotations

import base64
import re

# The environment the action gets: the inherited fd's number and the grant's token.
ENV_FD = "SENSORIUM_SIGNER_FD"
ENV_TOKEN = "SENSORIUM_SIGNER_TOKEN"
# The socket's name in the state dir's run/ (0700: reachable by the node's processes only).
SOCKET_NAME = "signer.sock"
PREFIX = b"sensorium-signed.v1"
# The connector's first line on a grant's channel: {BIND: token}.
BIND = "bind"
# A domain tag: dotted lowercase segments, at least two (``git.commit.v1``). As a JSON
# Schema (ECMA) pattern ``$`` ends the text; Python's ``$`` also passes a trailing
# newline, so Python checks it with ``fullmatch``.
DOMAIN_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+\Z"
DOMAIN_MAX = 128
_DOMAIN = re.compile(DOMAIN_PATTERN)
_HEX64 = re.compile(r"[0-9a-f]{64}")
# A request line longer than this is malformed (the connection is closed).
MAX_LINE = 4096


def valid_domain(domain: object) -> bool:
    return isinstance(domain, str) and len(domain) <= DOMAIN_MAX and bool(_DOMAIN.fullmatch(domain))


def valid_digest(digest: object) -> bool:
    return isinstance(digest, str) and bool(_HEX64.fullmatch(digest))


def signed_bytes(domain: str, digest_hex: str) -> bytes:
    """Exactly what the signer signs for ``domain`` and a payload of SHA-256 ``digest_hex``."""
    if not valid_domain(domain) or not valid_digest(digest_hex):
        raise ValueError("a domain tag and a lowercase hex SHA-256 are needed")
    return PREFIX + b"\x00" + domain.encode() + b"\x00" + bytes.fromhex(digest_hex)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
