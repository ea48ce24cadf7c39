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
# What one plan message may carry: its JSON, and its fds.
MAX_PLAN_BYTES = 1 << 20
MAX_FDS = 8


class Mount(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One mount made in the action's mount namespace, in plan order."""

    kind: Literal["tmpfs", "bind", "overlay", "mkdir"]
    target: str
    source: str | None = None
    size_bytes: int = 0
    # tmpfs: an inode cap (nr_inodes), so empty files cannot grow the host's slab
    # past what the byte cap suggests.
    inodes: int | None = None
    mode: int = 0o700
    read_only: bool = False
    # overlay: "lowerdir=…,upperdir=…,workdir=…"
    options: str | None = None
    # tmpfs and mkdir: owner, so the unprivileged action can write there. None leaves
    # the owner to the kernel: inside a user namespace only the mapped ids exist, and
    # ``uid=0`` is refused (EINVAL) there.
    uid: int | None = None
    gid: int | None = None
    # tmpfs: hand a directory fd of the new mount back to the connector over the
    # plan's control socket, so it can read what the action left there (C3's upper
    # layer, C5's artifacts) after the action's namespaces are gone.
    export: bool = False


class Landlock(msgspec.Struct, frozen=True, kw_only=True):
    read: list[str]
    full: list[str]
    tcp_connect_ports: list[int] = msgspec.field(default_factory=list)


class Egress(msgspec.Struct, frozen=True, kw_only=True):
    """C4: bring loopback up, route everything to it, open these listeners (TCP) and
    bound sockets (UDP), IPv4 and IPv6, and pass them out."""

    listen_ports: list[int]
    udp_ports: list[int] = msgspec.field(default_factory=list)


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
    # With a PID namespace: mount a procfs of it at /proc. A container's masked /proc
    # refuses a fresh one; the host's then stays, read-only.
    proc: bool = True
    # Unprivileged connector: a user namespace mapping its own ids, nothing more.
    user_namespace: bool = False
    # Ids the action runs as (the connector's own ids when it is not root).
    uid: int
    gid: int
    mounts: list[Mount] = msgspec.field(default_factory=list)
    landlock: Landlock | None = None
    seccomp: bool = True
    # The socket families seccomp lets the action create: "inet" (AF_INET and
    # AF_INET6 only; its network namespace decides where they reach) or "none"
    # (no network namespace: no socket at all).
    sockets: Literal["inet", "none"] = "inet"
    rlimits: dict[str, int] = msgspec.field(default_factory=dict)
    egress: Egress | None = None
    # Index among the extra fds of the socket on which the init sends, once its
    # namespace is set up, one message: the exported mounts' fds in plan order, then
    # the egress listeners and the DNS socket.
    control_fd: int | None = None
    # An extra fd to hand the action at this number (the sealed script), or None.
    exec_fd: int | None = None
    # An extra fd of the pinned binary itself (hashed on these bytes): exec'd through
    # the fd (fexecve), never by its path again.
    binary_fd: int | None = None
    # An extra fd the action inherits at the next number after the script (3 or 4): the
    # scoped signer grant's channel, opaque to the connector.
    hand_fd: int | None = None
    # An extra fd of the action's own cgroup's cgroup.procs (run/cgroup.py): the
    # program joins it before exec, so its whole tree is accounted there.
    cgroup_fd: int | None = None
    # An extra fd the target reads one byte from before it applies anything of the plan
    # (a pipe from the connector): the sandbox is built while the connector's start
    # journal syncs, and nothing of the action runs before that row is on disk. EOF
    # (the start was refused, or the connector is gone): it never execs.
    gate_fd: int | None = None
    extra_fds: int = 0


ENCODER = msgspec.json.Encoder()
DECODER = msgspec.json.Decoder(Plan)
