"""The sandbox plan: everything the spawn stage builds for one action, as one value.

The connector decides (class, fs profile, caps); the stage only executes the plan
in order. Keeping the decision out of the forked code means the code that runs
between fork and exec has no policy in it to get wrong.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# Fds that travel with a plan over the zygote socket, in this order; then
# ``extra_fds`` more (the sealed script, the egress control socket).
FD_STDOUT, FD_STDERR, FD_REPORT = 0, 1, 2


class Mount(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One mount made in the action's mount namespace, in plan order."""

    kind: Literal["tmpfs", "bind", "overlay", "mkdir"]
    target: str
    source: str | None = None
    size_bytes: int = 0
    mode: int = 0o700
    read_only: bool = False
    # overlay: "lowerdir=…,upperdir=…,workdir=…"
    options: str | None = None
    # overlay: the mount holding upperdir, made writable again after / went read-only
    writable: str | None = None
    # tmpfs: owner, so the unprivileged action can write there
    uid: int = 0
    gid: int = 0


class Landlock(msgspec.Struct, frozen=True, kw_only=True):
    read: list[str]
    full: list[str]
    tcp_connect_ports: list[int] = msgspec.field(default_factory=list)


class Egress(msgspec.Struct, frozen=True, kw_only=True):
    """C4: bring loopback up, route everything to it, open these listeners and pass them out."""

    listen_ports: list[int]
    control_fd: int  # index among the extra fds


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    # Echoed in the zygote's reply: a reply to an abandoned request is never
    # mistaken for the next one's.
    request: int = 0
    executable: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    # CLONE_NEW* flags for the action's namespaces.
    namespaces: int
    # Unprivileged connector: a user namespace mapping its own ids, nothing more.
    user_namespace: bool = False
    # Ids the action runs as (the connector's own ids when it is not root).
    uid: int
    gid: int
    mounts: list[Mount] = msgspec.field(default_factory=list)
    landlock: Landlock | None = None
    seccomp: bool = True
    rlimits: dict[str, int] = msgspec.field(default_factory=dict)
    egress: Egress | None = None
    # An extra fd to hand the action at this number (the sealed script), or None.
    exec_fd: int | None = None
    extra_fds: int = 0


ENCODER = msgspec.json.Encoder()
DECODER = msgspec.json.Decoder(Plan)
