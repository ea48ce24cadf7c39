"""``"interpreter": "/usr/bin/env"`` (seed 048's own C2/C6 examples), accepted safely.

``env python3 SCRIPT …`` would look ``python3`` up on whatever ``$PATH`` the action
has, at every run. Here the name (``argv_shape[0]``, the word after ``env``) is looked
up once, when the catalog loads, on a fixed search path that no environment changes;
what it resolved to (its real path and sha-256) is pinned, shown by
``sensorium catalog show``, and run directly — ``env`` itself never runs. A pinned
program whose bytes change afterwards stops the catalog from being authorized
(``authorization.Authorizer``) until the connector reloads it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

# Fixed, not $PATH: the operator's shell, the node's environment and the action's own
# environment all leave it as it is.
SEARCH_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
# A program name only: no directory, no env option (-S, -i), no VAR=value assignment.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}\Z")
_CHUNK = 1 << 20
# Digests by stat identity: a catalog of many `env python3` declarations hashes the
# interpreter once, not once per declaration.
_DIGESTS: dict[tuple[object, ...], str] = {}
_DIGESTS_MAX = 64


@dataclass(frozen=True)
class InterpreterPin:
    """What ``env NAME`` resolved to at load: the program the spawn runs instead."""

    declared: str  # the declared interpreter, /usr/bin/env
    name: str  # the word after env (argv_shape[0])
    path: str  # the real path it resolved to
    sha256: str
    # Its stat identity when hashed: a change forces the digest to be checked again.
    identity: tuple[object, ...] = ()

    def __str__(self) -> str:
        return f"{self.declared} {self.name} → {self.path} (sha256 {self.sha256})"


def is_env(path: str | None) -> bool:
    """Whether a declared interpreter is ``env`` (by its name or its link target's)."""
    if not path:
        return False
    return "env" in {os.path.basename(path), os.path.basename(os.path.realpath(path))}


def digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def identity(path: str) -> tuple[object, ...]:
    """What changes when the file at ``path`` does (or ``(path, None)`` if it is gone)."""
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def resolve(declared: str, name: str) -> InterpreterPin | str:
    """The pin for ``env NAME``, or why there is none (a problem message)."""
    if not _NAME.match(name):
        return (
            f"with {declared} as interpreter, argv_shape[0] names the program env runs; "
            f"{name[:80]!r} is not a plain program name (no path, option or VAR=value) — "
            "name an absolute interpreter instead"
        )
    for directory in SEARCH_PATH:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            real = os.path.realpath(candidate)
            try:
                before = identity(real)  # before hashing: a change meanwhile is seen later
                sha = _DIGESTS.get(before)
                if sha is None:
                    sha = digest(real)
                    if len(_DIGESTS) >= _DIGESTS_MAX:
                        _DIGESTS.clear()
                    _DIGESTS[before] = sha
                return InterpreterPin(declared, name, real, sha, before)
            except OSError as exc:
                return f"{declared} {name} resolved to {real}, which cannot be read: {exc}"
    return (
        f"{declared} {name}: no executable {name!r} in {':'.join(SEARCH_PATH)} "
        "(the fixed search path; $PATH is not used)"
    )


def drift(pin: InterpreterPin) -> str | None:
    """Why ``pin`` no longer holds (the program changed or went), or None."""
    try:
        now = digest(pin.path)
    except OSError as exc:
        return f"{pin}: cannot read it now: {exc.strerror or exc}"
    if now != pin.sha256:
        return f"{pin}: its sha256 is now {now}"
    return None
