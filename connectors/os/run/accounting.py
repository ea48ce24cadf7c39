"""What one action used: cpu time, peak memory and I/O bytes, measured where it is reaped.

Each action's processes are reaped by its sandbox's init (``sandbox/stage.py``) or,
outside a sandbox, by the launcher; whoever reaps them counts them here:

* **cpu and memory** from rusage: ``getrusage(RUSAGE_CHILDREN)`` of the init once its
  target is reaped (the program, whatever it waited for, and the orphans the init
  reaped), or ``wait4`` of the leader. ``peak_memory_bytes`` is then the largest
  resident set of any one of those processes (what rusage can say), not their sum.
  Where a delegated cgroup v2 holds the action (``cgroup.py``), its ``cpu.stat`` and
  ``memory.peak`` replace them: the whole tree, summed.
* **I/O bytes** from the kernel's per-task I/O accounting (``/proc/<pid>/io``:
  ``rchar``/``wchar``, bytes passed through read and write calls, files and pipes
  alike): what the reaper's own counters grew by while its children were reaped
  (:class:`IoTally`), or the leader's, read while it is a zombie (root only). cgroup
  v2's ``io.stat`` is not used: it sees only block-device traffic, and a write still
  in the page cache at exit not at all.

A value that cannot be measured is ``None`` (null on the wire), never a guess.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass, replace

# ru_maxrss is in KiB on Linux, bytes on macOS.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024
_FIELDS = ("cpu_user_ms", "cpu_system_ms", "peak_memory_bytes", "io_read_bytes", "io_write_bytes")


@dataclass(frozen=True)
class Usage:
    source: str  # "rusage" or "cgroup-v2"
    cpu_user_ms: float | None = None
    cpu_system_ms: float | None = None
    peak_memory_bytes: int | None = None
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None

    def line(self) -> str:
        """The report pipe's ``usage`` line (``-`` for what was not measured)."""
        values = " ".join(f"{k}={_text(getattr(self, k))}" for k in _FIELDS)
        return f"usage source={self.source} {values}"

    def with_cgroup(self, found: Usage | None) -> Usage:
        """cpu and memory from the action's cgroup where it had one; I/O stays ours."""
        if found is None:
            return self
        return replace(
            self,
            source=found.source,
            cpu_user_ms=found.cpu_user_ms,
            cpu_system_ms=found.cpu_system_ms,
            peak_memory_bytes=found.peak_memory_bytes
            if found.peak_memory_bytes is not None
            else self.peak_memory_bytes,
        )


def _text(v: float | int | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def parse_line(rest: str) -> Usage | None:
    """A ``usage`` line's words after ``usage``; None if it is not one we wrote."""
    words = dict(w.partition("=")[::2] for w in rest.split())
    source = words.get("source")
    if source not in ("rusage", "cgroup-v2"):
        return None
    try:
        v = {k: None if words.get(k, "-") == "-" else words[k] for k in _FIELDS}
        return Usage(
            source=source,
            cpu_user_ms=_float(v["cpu_user_ms"]),
            cpu_system_ms=_float(v["cpu_system_ms"]),
            peak_memory_bytes=_int(v["peak_memory_bytes"]),
            io_read_bytes=_int(v["io_read_bytes"]),
            io_write_bytes=_int(v["io_write_bytes"]),
        )
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    return None if text is None else int(text)


def _float(text: str | None) -> float | None:
    return None if text is None else float(text)


def _io_of(path: str) -> tuple[int, int, int] | None:
    """``(rchar, wchar, bytes this read itself returned)`` of a ``/proc/<pid>/io``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = b""
        while chunk := os.read(fd, 4096):
            raw += chunk
        fields = dict(line.split(b":", 1) for line in raw.splitlines() if b":" in line)
        return int(fields[b"rchar"]), int(fields[b"wchar"]), len(raw)
    except (OSError, KeyError, ValueError):
        return None
    finally:
        os.close(fd)


class IoTally:
    """The I/O of the children this process reaps, from its own counters.

    A reaper's ``/proc/self/io`` takes in each child it reaps (the kernel adds the
    child's counters to its parent's at the wait), so what the counters grew by between
    :meth:`__init__` and :meth:`totals` is the reaped children's I/O, once the reaper's
    own reads in between are taken off: reading the counters the first time, and any
    ``own_reads`` the caller counted. (A zombie's own ``/proc/<pid>/io`` is readable by
    root only, so an unprivileged reaper could not read its children's one by one.)
    """

    def __init__(self) -> None:
        self._start = _io_of("/proc/self/io")

    def totals(self, own_reads: int = 0) -> tuple[int | None, int | None]:
        end = _io_of("/proc/self/io")
        if self._start is None or end is None:
            return None, None
        rchar, wchar, cost = self._start
        return max(end[0] - rchar - cost - own_reads, 0), end[1] - wchar


def zombie_io(pid: int) -> tuple[int | None, int | None]:
    """An exited, unreaped child's own I/O (the children it reaped included); (None,
    None) where this process may not read it (only root may read a zombie's)."""
    got = _io_of(f"/proc/{pid}/io")
    return (None, None) if got is None else (got[0], got[1])


def from_rusage(ru: resource.struct_rusage, io: tuple[int | None, int | None]) -> Usage:
    read, written = io
    return Usage(
        source="rusage",
        cpu_user_ms=round(ru.ru_utime * 1000, 3),
        cpu_system_ms=round(ru.ru_stime * 1000, 3),
        peak_memory_bytes=ru.ru_maxrss * _MAXRSS_UNIT if ru.ru_maxrss > 0 else None,
        io_read_bytes=read,
        io_write_bytes=written,
    )


def of_children(io: IoTally, own_reads: int = 0) -> Usage:
    """Everything this process has reaped so far (the sandbox init's view)."""
    return from_rusage(resource.getrusage(resource.RUSAGE_CHILDREN), io.totals(own_reads))
