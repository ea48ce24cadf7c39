"""prctl(2) through ctypes: the few process attributes Sensorium sets on itself."""

from __future__ import annotations

import ctypes
import os

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36

# The interpreter's own symbols, libc's among them: ``find_library`` would run
# ``ldconfig -p`` in a child process at every import.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]
_libc.prctl.restype = ctypes.c_int


def prctl(option: int, arg: int) -> None:
    """Call prctl; raise ``OSError`` with the errno's reason when the kernel refuses."""
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {arg}): {os.strerror(err)}")
