"""A C3 commit killed at every step of the way: the next start leaves write_root exactly as
before or exactly as committed, and no debris (no temps, no trash, no half-made dirs)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sensorium.connectors.os.effects import commit as commit_mod
from sensorium.connectors.os.effects.commit import commit, recover
from sensorium.connectors.os.effects.fswrite import TEMP_PREFIX

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting tmpfs and overlay needs root")

# Imported from the unit tests' overlay helpers (tests/ is on the path).
from unit.test_fswrite import Overlay, snapshot  # noqa: E402


@pytest.fixture
def ovl(tmp_path: Path) -> Iterator[Overlay]:
    o = Overlay(Path(os.path.realpath(tmp_path)))
    try:
        yield o
    finally:
        o.unmount_all()


def _prepare(ovl: Overlay) -> Any:
    (ovl.root / "keep.txt").write_text("old keep\n")
    (ovl.root / "gone.txt").write_text("old gone\n")
    (ovl.root / "dir").mkdir()
    (ovl.root / "dir" / "inner.txt").write_text("old inner\n")
    with ovl as m:
        (m / "keep.txt").write_text("new keep\n")
        (m / "gone.txt").unlink()
        (m / "dir" / "inner.txt").write_text("new inner\n")
        (m / "fresh" / "deep").mkdir(parents=True)
        (m / "fresh" / "deep" / "made.txt").write_text("made\n")
        (m / "top.txt").write_text("top\n")
    ins = ovl.inspect()
    assert ins.ok, ins.problems
    return ins


def _killed_after(ovl: Overlay, ins: Any, call: str, n: int) -> bool:
    """Commit in a child that dies (SIGKILL) at the n-th ``os.<call>``; True if it died."""
    pid = os.fork()
    if pid == 0:
        real = getattr(os, call)
        count = 0

        def dying(*args: Any, **kwargs: Any) -> Any:
            nonlocal count
            count += 1
            if count > n:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        setattr(commit_mod.os, call, dying)
        try:
            commit(ins, ovl.upper, ovl.root)
        finally:
            os._exit(0)
    _pid, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


@pytest.mark.parametrize("call", ["rename", "fsync", "unlink"])
def test_a_commit_killed_at_any_step_is_all_or_nothing_after_recovery(
    ovl: Overlay, call: str
) -> None:
    ins = _prepare(ovl)
    before = snapshot(ovl.root)
    completed = False
    # Kill it at the first call, the second, ...: each try starts from the old tree
    # again (a rolled-back one is exactly that), until one runs through.
    for n in range(200):
        died = _killed_after(ovl, ins, call, n)
        lines = recover(ovl.root)
        after = snapshot(ovl.root)
        assert not [p for p in after if TEMP_PREFIX in p], (call, n, after, lines)
        if not died:
            completed = True
            assert after["keep.txt"][2] == b"new keep\n"
            assert "gone.txt" not in after
            assert after["fresh/deep/made.txt"][2] == b"made\n"
            break
        if after == before:
            continue  # rolled back whole
        # Otherwise it must be the committed tree, whole, and we are done.
        assert after["keep.txt"][2] == b"new keep\n", (call, n, after, lines)
        assert "gone.txt" not in after and after["top.txt"][2] == b"top\n", (call, n, after)
        assert after["dir/inner.txt"][2] == b"new inner\n", (call, n, after)
        completed = True
        break
    assert completed, f"the commit never completed within 200 {call} calls"
