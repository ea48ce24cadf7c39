"""Run a command under a seccomp filter that refuses what a restricted environment refuses.

A container's default seccomp profile (Docker's, systemd-nspawn's) answers EPERM for
the namespace, mount and Landlock calls; this reproduces that on a bare host, so the
suite sees what a user in such a container sees. The filter is inherited by every
process the command starts (the whole node)::

    python tests/confine.py unshare,mount,landlock,clone-ns -- sensorium up

Names: any syscall name (EPERM), ``landlock`` (its three calls), ``clone-ns``
(clone with any CLONE_NEW* flag: EPERM; clone3: ENOSYS, so libc falls back to
clone), ``netlink`` (socket(AF_NETLINK)).
"""

from __future__ import annotations

import errno
import os
import socket
import sys

import pyseccomp as sc

NAMESPACE_FLAGS = (
    0x00020000,
    0x02000000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
LANDLOCK = ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")


def build(names: list[str]) -> sc.SyscallFilter:
    f = sc.SyscallFilter(sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in names:
        if name == "landlock":
            for call in LANDLOCK:
                f.add_rule(eperm, call)
        elif name == "clone-ns":
            for flag in NAMESPACE_FLAGS:
                f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
            f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        elif name == "netlink":
            f.add_rule(eperm, "socket", sc.Arg(0, sc.EQ, socket.AF_NETLINK))
        else:
            f.add_rule(eperm, name)
    return f


def main() -> None:
    split = sys.argv.index("--")
    names = [n for n in sys.argv[1].split(",") if n]
    command = sys.argv[split + 1 :]
    f = build(names)
    f.load()  # pyseccomp sets no_new_privs first (the filter's default attribute)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
