"""Process-wide parts of the spawn baseline, applied once to the connector and inherited.

``no_new_privs`` and ``RLIMIT_CORE=0`` are inherited across fork and exec, so
setting them on the connector covers every child without a pre-exec hook (which
would cost the fast vfork path and is unsafe with threads).
"""

from __future__ import annotations

import os
import resource

from sensorium.shared.prctl import PR_SET_NO_NEW_PRIVS, prctl

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Never passed on, even with environment.inherit: they belong to this process.
_PRIVATE_ENV_PREFIXES = ("NOTIFY_SOCKET", "WATCHDOG_", "SENSORIUM_", "LISTEN_")


def harden_self() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def child_env(inherit: bool, declared: dict[str, str], scratch: str) -> dict[str, str]:
    """The curated environment: a fixed baseline, the declared set, nothing else by default."""
    env: dict[str, str] = {}
    if inherit:
        env.update({k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_ENV_PREFIXES)})
    env.update({"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": scratch, "TMPDIR": scratch})
    env.update(declared)
    return env
