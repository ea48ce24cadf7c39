"""Run one plan by a parked Python target and by the compiled exec stage; print both.

``python stage_compare.py CASE`` starts a real zygote twice (``SENSORIUM_EXEC_STAGE``
off, then on), runs the case's plan twice through each (the second run takes the
parked sandbox, where its shape is parked) and prints JSON
``{"python": seen, "staged": seen, "runs": [...]}``.
Root runs it as root; tests/unit/test_exec_stage.py also runs it as an ordinary uid,
whose plans use a user namespace of its own ids.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from sensorium.connectors.os.run.launcher import spawn
from sensorium.connectors.os.run.sandbox import execstage
from sensorium.connectors.os.run.sandbox import namespaces as ns
from sensorium.connectors.os.run.sandbox.plan import Landlock, Mount, Plan
from sensorium.connectors.os.run.sandbox.spawner import Sandboxed, Spawner
from sensorium.connectors.os.run.sandboxed import Sandbox
from sensorium.connectors.os.run.spawning import SpawnSpec

NAMESPACES = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWNET | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS
PROBE = r"""
# Read by the shell itself: a child would see it mid-fork, its signals blocked.
while read -r line; do
  case $line in Uid:*|Gid:*|Groups:*|NoNewPrivs:*|Seccomp:*|Sig*|Cap*) echo "$line";; esac
done < /proc/$$/status
grep -v "^Limit" /proc/$$/limits
ls /proc/$$/fd > /tmp/fds  # no pipeline: its pipe would be the shell's fds 3 and 4
echo fds: $(cat /tmp/fds)
awk '{print "session leader:", ($6 == $1)}' /proc/$$/stat
pwd; env | sort
cat /etc/hostname >/dev/null 2>&1 && echo read-granted: yes || echo read-granted: no
ls /root >/dev/null 2>&1 && echo read-other: yes || echo read-other: no
(: > /tmp/w) 2>/dev/null && echo write-full: yes || echo write-full: no
(: > /etc/w) 2>/dev/null && echo write-read: yes || echo write-read: no
echo on stderr >&2
echo "init: $(cat /proc/1/comm 2>/dev/null) $(tr '\0' ' ' < /proc/1/cmdline 2>/dev/null)"
"""
CASES: dict[str, dict[str, Any]] = {
    "probe": {},
    # No PID namespace: never parked, so the cold path (its init starts the stage).
    "cold": {"namespaces": NAMESPACES & ~ns.CLONE_NEWPID, "proc": False},
    "cwd": {"cwd": "/nonexistent"},
    "exec-missing": {"executable": "/nonexistent/prog"},
    "exec-dir": {"executable": "/usr"},
    "rlimit-unknown": {"rlimits": {"nofile": 64, "stack": 1 << 20}},
    # The connector's gate closes unopened (its start journal refused): nothing runs.
    "gate-closed": {"gate_fd": 0, "extra_fds": 1},
}


def plan(case: str) -> Plan:
    root = os.geteuid() == 0
    ids = 65534 if root else os.getuid(), 65534 if root else os.getgid()
    base = Plan(
        executable="/bin/sh",
        argv=["sh", "-c", PROBE],
        env={"PATH": "/usr/bin:/bin", "ONE": "1", "SPACED": "a b"},
        cwd="/tmp",
        namespaces=NAMESPACES,
        user_namespace=not root,
        uid=ids[0],
        gid=ids[1],
        mounts=[
            Mount(
                kind="tmpfs",
                target="/tmp",
                size_bytes=1 << 20,
                uid=ids[0] if root else None,
                gid=ids[1] if root else None,
            )
        ],
        landlock=Landlock(
            read=["/usr", "/bin", "/lib", "/lib64", "/etc", "/proc"], full=["/tmp", "/dev/null"]
        ),
        rlimits={"nofile": 64, "nproc": 4096, "core": 0, "fsize": 1 << 20, "data": 1 << 30},
    )
    fields = {f: getattr(base, f) for f in base.__struct_fields__}
    return Plan(**{**fields, **CASES[case]})


async def _runs(p: Plan, n: int) -> list[dict[str, Any]]:
    spawner = Spawner()
    spawner.start()
    handed: list[Sandboxed] = []
    original = spawner.spawn

    async def spy(*args: Any, **kw: Any) -> Sandboxed:
        sb = await original(*args, **kw)
        handed.append(sb)
        return sb

    spawner.spawn = spy  # type: ignore[method-assign]
    try:
        seen = []
        for _ in range(n):
            spec = SpawnSpec("/bin/sh", ["sh"], {}, "/tmp", 30, 1 << 16, 1 << 16)
            extra = []
            if p.gate_fd is not None:
                gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
                os.close(gate_w)
                extra = [gate_r]
            try:
                r = await spawn(spec, sandbox=Sandbox(spawner, p, extra))
            finally:
                for fd in extra:
                    os.close(fd)
            sb = handed[-1]
            out = bytes(r.stdout.data).decode().splitlines(keepends=True)
            usage = r.usage
            seen.append(
                {
                    # Who pid 1 of the namespace was is the one thing the paths differ in.
                    "stdout": "".join(x for x in out if not x.startswith("init: ")),
                    "init": "".join(x[6:].strip() for x in out if x.startswith("init: ")),
                    "stderr": bytes(r.stderr.data).decode(),
                    "error": r.spawn_error,
                    "exit": r.exit_code,
                    "usage": None
                    if usage is None
                    else sorted(
                        k
                        for k in ("cpu_user_ms", "cpu_system_ms", "io_read_bytes", "io_write_bytes")
                        if getattr(usage, k) is not None
                    ),
                    "peak": None if usage is None else usage.peak_memory_bytes,
                    "pooled": sb.pooled,
                    "staged": sb.staged,
                }
            )
        return seen
    finally:
        spawner.close()


def main() -> None:
    p = plan(sys.argv[1])
    # As a node started under nohup (or by a parent that ignores more) would be: both
    # paths must hand the action every signal at its default, not what they inherited.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    os.environ[execstage.ENV_SWITCH] = "off"
    python = asyncio.run(_runs(p, 2))
    del os.environ[execstage.ENV_SWITCH]
    staged = asyncio.run(_runs(p, 2))
    print(json.dumps({"python": python[1], "staged": staged[1], "runs": staged}))


if __name__ == "__main__":
    main()
