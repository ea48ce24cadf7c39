"""``sensorium-sign --domain D < payload``: the action's side of the scoped signer grant.

Reads the payload on stdin (hashed as it streams; it never leaves the sandbox), asks
the grant's signer over the inherited socket, and prints the answer as one JSON object:
``domain``, ``payload/sha256``, ``key/id``, ``signature`` (base64url Ed25519 over
``protocol.signed_bytes``). Exit 0 signed; 2 usage; 3 refused (the code on stderr);
4 no grant here, or its signer is gone. One call at a time per action.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
from collections.abc import Sequence

from sensorium.shared.signer.protocol import ENV_FD, ENV_TOKEN, MAX_LINE

EXIT_REFUSED = 3
EXIT_UNAVAILABLE = 4
UNAVAILABLE = "signer-unavailable"


def _fail(code: str, message: str, status: int) -> int:
    print(f"sensorium-sign: {code}: {message}", file=sys.stderr)
    return status


def _digest(stream: object) -> str:
    h = hashlib.sha256()
    read = stream.read  # type: ignore[attr-defined]
    while chunk := read(1 << 16):
        h.update(chunk)
    return h.hexdigest()


def ask(fd: int, token: str, domain: str, digest: str) -> dict[str, object]:
    """One request over the inherited socket; the fd stays open for the next call."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        line = json.dumps({"token": token, "domain": domain, "payload/sha256": digest})
        sock.sendall(line.encode() + b"\n")
        buf = b""
        while b"\n" not in buf:
            chunk = sock.recv(MAX_LINE)
            if not chunk:
                raise ConnectionError("the signer closed the grant's channel")
            buf += chunk
            if len(buf) > 4 * MAX_LINE:
                raise ConnectionError("the signer's answer is too long")
    finally:
        sock.close()
    reply = json.loads(buf.split(b"\n", 1)[0])
    if not isinstance(reply, dict):
        raise ConnectionError("the signer's answer is not an object")
    return reply


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sensorium-sign", description="Sign stdin under this action's scoped signer grant."
    )
    parser.add_argument("--domain", required=True, help="the signing domain, e.g. git.commit.v1")
    args = parser.parse_args(argv)
    fd_text, token = os.environ.get(ENV_FD), os.environ.get(ENV_TOKEN)
    if not fd_text or not token or not fd_text.isdigit():
        return _fail(UNAVAILABLE, "this process holds no signer grant", EXIT_UNAVAILABLE)
    digest = _digest(sys.stdin.buffer)
    try:
        reply = ask(int(fd_text), token, args.domain, digest)
    except (OSError, ValueError) as exc:
        return _fail(UNAVAILABLE, str(exc), EXIT_UNAVAILABLE)
    if reply.get("ok") is not True:
        return _fail(str(reply.get("code")), str(reply.get("message")), EXIT_REFUSED)
    reply.pop("ok", None)
    print(json.dumps(reply, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
