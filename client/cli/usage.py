"""One line saying what an action used (its outcome's ``accounting``)."""

from __future__ import annotations

from sensorium.shared.wire.outcome import Accounting

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def size(n: int | None) -> str:
    """``3.9 MiB``; ``?`` when it was not measured."""
    if n is None:
        return "?"
    value = float(n)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _ms(v: float | None) -> str:
    return "?" if v is None else f"{v:.1f}"


def usage_line(a: Accounting) -> str:
    """``used · cpu 12.0 ms (user 10.0 + sys 2.0) · peak memory 3.9 MiB · read … · wrote …``"""
    if a.cpu_user_ms is None or a.cpu_system_ms is None:
        cpu = f"cpu ? ms (user {_ms(a.cpu_user_ms)} + sys {_ms(a.cpu_system_ms)})"
    else:
        total = a.cpu_user_ms + a.cpu_system_ms
        cpu = f"cpu {total:.1f} ms (user {a.cpu_user_ms:.1f} + sys {a.cpu_system_ms:.1f})"
    via = " · via cgroup" if a.source == "cgroup-v2" else ""
    return (
        f"used · {cpu} · peak memory {size(a.peak_memory_bytes)} · "
        f"read {size(a.io_read_bytes)} · wrote {size(a.io_write_bytes)}{via}"
    )
