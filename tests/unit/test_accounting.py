"""Accounting's pieces that need no live node: the report line, the cgroup v2 probe and
reading, and the CLI's line (the live checks are tests/integration/test_accounting.py)."""

from __future__ import annotations

from pathlib import Path

from sensorium.client.cli.usage import size, usage_line
from sensorium.connectors.os.run import cgroup
from sensorium.connectors.os.run.accounting import IoTally, Usage, parse_line
from sensorium.shared.wire.outcome import Accounting

HYBRID = """\
31 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
"""
V1_ONLY = "42 31 0:39 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"


def test_the_report_line_round_trips_and_keeps_what_was_not_measured_unknown() -> None:
    u = Usage("rusage", 12.5, 3.25, 4096, None, 7)
    word, _, rest = u.line().partition(" ")
    assert word == "usage"
    assert parse_line(rest) == u
    assert parse_line("source=guess cpu_user_ms=1") is None
    assert parse_line("source=rusage cpu_user_ms=x") is None


def test_the_io_tally_takes_off_its_own_reads(tmp_path: Path) -> None:
    """Nothing reaped, nothing read but the counters: nothing counted."""
    tally = IoTally()
    read, written = tally.totals()
    assert read == 0 and written == 0


def test_the_cgroup2_mount_and_own_cgroup_are_found() -> None:
    assert cgroup.cgroup2_mount(HYBRID) == Path("/sys/fs/cgroup/unified")
    assert cgroup.cgroup2_mount(V1_ONLY) is None
    assert cgroup.own_cgroup("9:name=systemd:/\n0::/system.slice/s.service/c\n") == (
        "/system.slice/s.service/c"
    )
    assert cgroup.own_cgroup("9:memory:/\n") is None


def test_no_cgroup_v2_means_rusage(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(V1_ONLY)
    (tmp_path / "cgroup").write_text("0::/\n")
    assert cgroup.probe(tmp_path / "mountinfo", tmp_path / "cgroup") is None


def test_a_tree_that_only_looks_delegated_is_refused(tmp_path: Path) -> None:
    """Chosen by probing: files that say `memory` on an ordinary filesystem are not a
    cgroup (no kernel files appear in a new directory), so nothing is used."""
    root = tmp_path / "cg"
    svc = root / "svc"
    svc.mkdir(parents=True)
    (svc / "cgroup.subtree_control").write_text("memory pids\n")
    (svc / "cgroup.procs").write_text("")
    (tmp_path / "mountinfo").write_text(f"41 31 0:38 / {root} rw - cgroup2 cgroup2 rw\n")
    (tmp_path / "cgroup").write_text("0::/svc/connector\n")
    assert cgroup.probe(tmp_path / "mountinfo", tmp_path / "cgroup") is None
    assert not any((svc / cgroup.BASE_NAME).glob("a-*")), "the trial cgroup was left"


def test_this_machine_gets_what_its_hierarchy_allows() -> None:
    """Whatever this host is, the probe agrees with its files: a cgroup v2 parent that
    gives its children `memory`, or rusage."""
    found = cgroup.probe()
    if found is not None:
        assert "memory" in (found.base / "cgroup.subtree_control").read_text().split()


def test_an_action_cgroup_is_read_whole_and_an_empty_one_is_not_used(tmp_path: Path) -> None:
    g = cgroup.ActionGroup(tmp_path, -1)
    (tmp_path / "cpu.stat").write_text(
        "usage_usec 15000\nuser_usec 12000\nsystem_usec 3000\nnr_periods 0\n"
    )
    (tmp_path / "memory.peak").write_text("73400320\n")
    assert g.usage() == Usage("cgroup-v2", 12.0, 3.0, 73400320)
    (tmp_path / "cpu.stat").write_text("usage_usec 0\nuser_usec 0\nsystem_usec 0\n")
    assert g.usage() is None  # the program never joined it: rusage stays
    (tmp_path / "memory.peak").unlink()
    assert g.usage() is None


def test_cgroup_figures_replace_cpu_and_memory_but_not_io() -> None:
    mine = Usage("rusage", 1.0, 1.0, 100, 10, 20)
    merged = mine.with_cgroup(Usage("cgroup-v2", 5.0, 6.0, 999))
    assert merged == Usage("cgroup-v2", 5.0, 6.0, 999, 10, 20)
    assert mine.with_cgroup(None) == mine


def test_the_cli_line() -> None:
    a = Accounting(
        source="rusage",
        cpu_user_ms=10.0,
        cpu_system_ms=2.5,
        peak_memory_bytes=4 * 1024 * 1024,
        io_read_bytes=1536,
        io_write_bytes=80,
    )
    assert usage_line(a) == (
        "used · cpu 12.5 ms (user 10.0 + sys 2.5) · peak memory 4.0 MiB · read 1.5 KiB · wrote 80 B"
    )
    unknown = Accounting(source="cgroup-v2", cpu_user_ms=1.0)
    assert usage_line(unknown) == (
        "used · cpu ? ms (user 1.0 + sys ?) · peak memory ? · read ? · wrote ? · via cgroup"
    )
    assert size(0) == "0 B" and size(5 * 1024**4) == "5.0 TiB"
