"""Landlock read grants with holes: hide a subtree without a mount namespace.

Landlock only allows; it cannot deny a path beneath a granted tree. Where no
mount namespace can mask a path (the Landlock-only tier), the grant of an
ancestor is replaced by grants of that ancestor's entries, except the one on the
way to the hidden path, down to it — a bounded walk at spawn, over the
directories on the way only:

>>> import tempfile, os
>>> top = tempfile.mkdtemp()
>>> for d in ("a", "b", "b/secret", "b/open"):
...     os.mkdir(os.path.join(top, d))
>>> sorted(os.path.relpath(g, top) for g in carve([top], [os.path.join(top, "b/secret")]))
['a', 'b/open']

Entries that are symbolic links are left out: a grant follows a link to its target,
which may lie inside the hidden tree; whatever a link points at is granted (or not)
on its own. Entries created after the spawn are not granted (stricter, never looser).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

# Entries granted at the most for one hidden path's walk; past it the walk refuses.
MAX_ENTRIES = 4096


class CarveError(OSError):
    """The grants could not be narrowed within bounds: the action must not run (an
    OSError, so the connector answers it as spawn-failed like any envelope it cannot build)."""


def _under(path: str, tree: str) -> bool:
    return path == tree or tree == "/" or path.startswith(tree.rstrip("/") + "/")


def carve(grants: Sequence[str], hidden: Sequence[str]) -> list[str]:
    """``grants`` with every path of ``hidden`` (and what lies beneath it) left out."""
    result = list(dict.fromkeys(grants))
    count = 0
    for h in sorted(set(hidden), key=len):
        if h == "/":
            raise CarveError("cannot hide the whole file system")
        nxt: list[str] = []
        for g in result:
            if _under(g, h):
                continue  # inside the hidden tree: dropped whole
            if not _under(h, g):
                nxt.append(g)
                continue
            # g is an ancestor of h: grant g's entries beside the way down, level by level.
            parent = g
            rest = [p for p in h[len(g.rstrip("/")) :].split("/") if p]
            for i, name in enumerate(rest):
                try:
                    entries = os.listdir(parent)
                except OSError:
                    break  # unreadable: nothing beneath it is granted
                for entry in entries:
                    if entry == name:
                        continue
                    path = os.path.join(parent, entry)
                    if os.path.islink(path):
                        continue
                    nxt.append(path)
                    count += 1
                    if count > MAX_ENTRIES:
                        raise CarveError(
                            f"hiding {h!r} would take more than {MAX_ENTRIES} Landlock rules"
                        )
                parent = os.path.join(parent, name)
                if i == len(rest) - 1 or not os.path.isdir(parent) or os.path.islink(parent):
                    break
        result = nxt
    return result
