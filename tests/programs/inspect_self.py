"""Prints, as JSON, what the spawn baseline gave this process."""

import json
import os
import resource
import stat
import sys


def status_field(name):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return None


fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
stdin = os.fstat(0)
print(
    json.dumps(
        {
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "sid": os.getsid(0),
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "fds": fds,
            "stdin_is_chr": stat.S_ISCHR(stdin.st_mode),
            "stdin_rdev": [os.major(stdin.st_rdev), os.minor(stdin.st_rdev)],
            "isatty": [os.isatty(0), os.isatty(1), os.isatty(2)],
            "no_new_privs": status_field("NoNewPrivs"),
            "rlimit_core": list(resource.getrlimit(resource.RLIMIT_CORE)),
            "argv": sys.argv,
        }
    )
)
