"""The node's own places, which no action may see whatever the uid it runs as."""

from __future__ import annotations

import os

from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import Declaration


def private_paths(paths: StatePaths) -> list[str]:
    """The node's own places no action may see: its state dir, the connector's home and
    runtime directory (keys, sockets, logs, databases, whatever the user keeps there)."""
    found = [str(paths.root)]
    for var in ("HOME", "XDG_RUNTIME_DIR"):
        value = os.environ.get(var)
        if value and os.path.isabs(value):
            found.append(value)
    real = [os.path.realpath(p) for p in found]
    return [p for p in dict.fromkeys(real) if p != "/" and os.path.isdir(p)]


def needed_beneath(decl: Declaration, hidden: str) -> bool:
    """Whether the action's own files lie beneath ``hidden`` (then only the state dir,
    never its tree as a whole, is hidden: a user's scripts may live in their home)."""
    own = [decl.executable.path, decl.executable.interpreter]
    if decl.script is not None:
        own += decl.script.allowed_roots
    if decl.fs_write is not None:
        own.append(decl.fs_write.write_root)
    return any(p and os.path.realpath(p).startswith(hidden.rstrip("/") + "/") for p in own)
