"""Load-time checks of a declaration's ``signing`` block (seed 048).

The schema bounds the domains and ``max_signatures``; here the rest, reported with
every other problem of the catalog: each domain is a whole domain tag (the schema's
pattern, as msgspec applies it, lets a trailing newline through), ``key_ref.kind`` is
one the host signer holds, ``key_ref`` names nothing else it would ignore, and the
action runs only as a sync directive (a grant lives and ends with one dispatch; a
deferred job outlives it).
"""

from __future__ import annotations

import re

from sensorium.shared.signer.protocol import valid_domain
from sensorium.shared.wire.declaration import SIGNING_KEY_KINDS, Declaration

LABEL = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def signing_problems(decl: Declaration) -> list[tuple[str, str]]:
    """(field path, message) for each problem of ``decl.signing``; none without one."""
    s = decl.signing
    if s is None:
        return []
    found: list[tuple[str, str]] = []
    for i, domain in enumerate(s.allowed_domains):
        if not valid_domain(domain):
            found.append((f"signing.allowed_domains[{i}]", f"{domain!r} is not a domain tag"))
    kind = s.key_ref.get("kind")
    if kind not in SIGNING_KEY_KINDS:
        found.append(
            (
                "signing.key_ref.kind",
                f"{kind!r} is not a key kind the host signer holds; one of "
                + ", ".join(SIGNING_KEY_KINDS),
            )
        )
    allowed = {"kind", "label"} if kind == "derived" else {"kind"}
    for extra in sorted(set(s.key_ref) - allowed):
        found.append((f"signing.key_ref.{extra}", f"not a field of a {kind!r} key_ref"))
    if kind == "derived":
        label = s.key_ref.get("label")
        if not isinstance(label, str) or not LABEL.fullmatch(label):
            found.append(
                (
                    "signing.key_ref.label",
                    "a derived key names its label: 1-64 of a-z 0-9 . _ - (first a-z 0-9)",
                )
            )
    if decl.execution_mode_support != "sync-only":
        found.append(
            (
                "execution_mode_support",
                "an action with signing runs as a sync directive only: its signer grant "
                "ends with the directive's dispatch",
            )
        )
    return found
