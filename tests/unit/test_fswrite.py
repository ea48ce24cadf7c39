"""C3 commit: a real overlay's upper layer is inspected, then committed all or nothing."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sensorium.connectors.os.effects.commit import commit
from sensorium.connectors.os.effects.fswrite import (
    TEMP_PREFIX,
    CommitError,
    Inspection,
    check_write_root,
    inspect,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting tmpfs and overlay needs root")


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


class Overlay:
    """write_root (the lower layer) seen through an overlay whose upper is on a tmpfs."""

    def __init__(self, base: Path) -> None:
        self.root, self.tmpfs, self.merged = base / "root", base / "t", base / "m"
        self.upper, self.work = self.tmpfs / "u", self.tmpfs / "w"
        self.mounts: list[Path] = []
        for d in (self.root, self.tmpfs, self.merged):
            d.mkdir()

    def mount(self, target: Path, *args: str) -> None:
        _run("mount", *args, str(target))
        self.mounts.append(target)

    def __enter__(self) -> Path:
        """Mount the overlay; the body acts as the action on the merged view."""
        if not self.mounts:
            self.mount(self.tmpfs, "-t", "tmpfs", "-o", "size=1m", "tmpfs")
            self.upper.mkdir()
            self.work.mkdir()
        opts = f"lowerdir={self.root},upperdir={self.upper},workdir={self.work}"
        self.mount(self.merged, "-t", "overlay", "-o", opts, "overlay")
        return self.merged

    def __exit__(self, *exc: object) -> None:
        _run("umount", str(self.mounts.pop()))

    def unmount_all(self) -> None:
        while self.mounts:
            subprocess.run(["umount", "-l", str(self.mounts.pop())], check=False)

    def inspect(self, **kw: Any) -> Inspection:
        args: dict[str, Any] = {
            "write_root": self.root,
            "max_bytes_total": 1 << 20,
            "max_bytes_per_file": 1 << 20,
            "path_pattern": None,
            "may_modify": lambda p: True,
        }
        return inspect(self.upper, **(args | kw))


@pytest.fixture
def ovl(tmp_path: Path) -> Iterator[Overlay]:
    o = Overlay(Path(os.path.realpath(tmp_path)))
    try:
        yield o
    finally:
        o.unmount_all()


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything under root, without following links: type, mode, content or target."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[str(p.relative_to(root))] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[str(p.relative_to(root))] = ("dir", st.st_mode)
            else:
                out[str(p.relative_to(root))] = ("file", st.st_mode, p.read_bytes())
    return out


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_new_overwrite_delete_commit(ovl: Overlay) -> None:
    (ovl.root / "a.txt").write_text("old")
    (ovl.root / "gone.txt").write_text("bye")
    (ovl.root / "keep.txt").write_text("same")
    with ovl as m:
        (m / "a.txt").write_text("new content")
        (m / "gone.txt").unlink()
        (m / "sub").mkdir()
        (m / "sub" / "n.bin").write_bytes(b"\x00\x01")
        os.chmod(m / "sub" / "n.bin", 0o640)
    ins = ovl.inspect()
    assert ins.ok, ins.problems
    assert [(f.path, f.bytes, f.sha256, f.deleted) for f in ins.files] == [
        ("a.txt", 11, sha(b"new content"), False),
        ("gone.txt", 0, None, True),
        ("sub/n.bin", 2, sha(b"\x00\x01"), False),
    ]
    assert ins.bytes_total == 13
    commit(ins, ovl.upper, ovl.root)
    assert (ovl.root / "a.txt").read_text() == "new content"
    assert not (ovl.root / "gone.txt").exists()
    assert (ovl.root / "keep.txt").read_text() == "same"
    assert sha((ovl.root / "sub" / "n.bin").read_bytes()) == ins.files[2].sha256
    assert stat.S_IMODE((ovl.root / "sub" / "n.bin").stat().st_mode) == 0o640
    assert sorted(p.name for p in ovl.root.iterdir()) == ["a.txt", "keep.txt", "sub"]


def test_rm_rf_then_recreate_is_an_opaque_dir(ovl: Overlay) -> None:
    (ovl.root / "d" / "sub").mkdir(parents=True)
    (ovl.root / "d" / "x").write_text("x")
    (ovl.root / "d" / "sub" / "y").write_text("y")
    (ovl.root / "e" / "f").mkdir(parents=True)
    with ovl as m:
        subprocess.run(["rm", "-rf", str(m / "d"), str(m / "e")], check=True)
        (m / "d").mkdir()
        (m / "d" / "z").write_text("z")
    assert os.getxattr(ovl.upper / "d", "trusted.overlay.opaque") == b"y"
    ins = ovl.inspect()
    assert ins.ok, ins.problems
    assert [(f.path, f.deleted) for f in ins.files] == [
        ("d/sub", True),
        ("d/x", True),
        ("d/z", False),
        ("e", True),
    ]
    commit(ins, ovl.upper, ovl.root)
    assert snapshot(ovl.root) == {
        "d": ("dir", (ovl.root / "d").stat().st_mode),
        "d/z": ("file", (ovl.root / "d" / "z").stat().st_mode, b"z"),
    }


def test_symlink_fifo_and_hardlink_are_problems_and_nothing_commits(ovl: Overlay) -> None:
    (ovl.root / "a").write_text("a")
    before = snapshot(ovl.root)
    with ovl as m:
        os.symlink("/etc/shadow", m / "s")
        os.mkfifo(m / "p")
        (m / "h1").write_text("h")
        os.link(m / "h1", m / "h2")
        (m / "a").write_text("changed")
    ins = ovl.inspect()
    assert not ins.ok
    assert "s: symlink — C3 commits regular files only" in ins.problems
    assert "p: FIFO — C3 commits regular files only" in ins.problems
    assert any(p.startswith("h1: 2 hard links") for p in ins.problems)
    with pytest.raises(ValueError, match="problems"):
        commit(ins, ovl.upper, ovl.root)
    assert snapshot(ovl.root) == before


def test_caps_pattern_and_policy_are_all_reported(ovl: Overlay) -> None:
    (ovl.root / "out").mkdir()
    (ovl.root / "out" / "secret.txt").write_text("s")
    with ovl as m:
        (m / "out" / "big.txt").write_bytes(b"b" * 300)
        (m / "out" / "ok.txt").write_bytes(b"o" * 200)
        (m / "out" / "x.bin").write_bytes(b"x")
        (m / "out" / "secret.txt").unlink()
    ins = ovl.inspect(
        max_bytes_total=400,
        max_bytes_per_file=250,
        path_pattern=r"out/[^/]+\.txt",
        may_modify=lambda p: not p.endswith("secret.txt"),
    )
    assert ins.problems == (
        "501 bytes written, over max_bytes_total 400",
        "out/big.txt: 300 bytes, over max_bytes_per_file 250",
        f"out/secret.txt: the fs policy does not allow modifying {ovl.root}/out/secret.txt",
        "out/x.bin: does not match path_pattern 'out/[^/]+\\\\.txt'",
    )
    assert ins.bytes_total == 501


def test_problem_list_is_bounded(ovl: Overlay) -> None:
    with ovl as m:
        for i in range(60):
            os.symlink("x", m / f"l{i:02}")
    ins = ovl.inspect()
    assert len(ins.problems) == 51
    assert ins.problems[-1] == "and 10 more"


def test_type_change_is_a_problem(ovl: Overlay) -> None:
    (ovl.root / "f").write_text("file")
    with ovl as m:
        (m / "f").unlink()
        (m / "f").mkdir()
        (m / "f" / "x").write_text("x")
    assert ovl.inspect().problems == ("f: replaces a non-directory — C3 commits no type change",)


def test_symlinked_parent_fails_phase_one_and_changes_nothing(ovl: Overlay, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (ovl.root / "b").write_text("old b")
    (ovl.root / "sub").mkdir()
    with ovl as m:
        (m / "a").write_text("new a")
        (m / "b").write_text("new b")
        (m / "sub" / "x").write_text("x")
    ins = ovl.inspect()
    assert ins.ok, ins.problems
    # Between inspection and commit, sub becomes a link out of write_root.
    (ovl.root / "sub").rmdir()
    (ovl.root / "sub").symlink_to(outside)
    before, fds = snapshot(ovl.root), open_fds()
    with pytest.raises(CommitError, match="unchanged: sub in write_root is a symlink"):
        commit(ins, ovl.upper, ovl.root)
    assert snapshot(ovl.root) == before
    assert open_fds() == fds
    assert list(outside.iterdir()) == []


def test_failure_in_phase_two_rolls_back(ovl: Overlay) -> None:
    (ovl.root / "a").write_text("old a")
    (ovl.root / "m").mkdir()
    (ovl.root / "m" / "f").write_text("f")
    with ovl as m:
        (m / "a").write_text("new a")
        (m / "m" / "f").unlink()
    ins = ovl.inspect()
    assert [f.path for f in ins.files] == ["a", "m/f"]
    # A mount appears on m: moving m/f aside (rename) now crosses filesystems.
    ovl.mount(ovl.root / "m", "-t", "tmpfs", "-o", "size=64k", "tmpfs")
    (ovl.root / "m" / "f").write_text("f on tmpfs")
    before, fds = snapshot(ovl.root), open_fds()
    with pytest.raises(CommitError, match="rolled back"):
        commit(ins, ovl.upper, ovl.root)
    assert snapshot(ovl.root) == before
    assert open_fds() == fds
    assert (ovl.root / "a").read_text() == "old a"


def test_upper_changed_after_inspection_is_refused(ovl: Overlay) -> None:
    with ovl as m:
        (m / "a").write_text("one")
    ins = ovl.inspect()
    (ovl.upper / "a").write_text("two")
    with pytest.raises(CommitError, match="changed in the upper layer"):
        commit(ins, ovl.upper, ovl.root)
    assert [p.name for p in ovl.root.iterdir()] == []


def test_no_temp_or_trash_is_left_behind(ovl: Overlay) -> None:
    with ovl as m:
        (m / "deep" / "er").mkdir(parents=True)
        (m / "deep" / "er" / "f").write_text("f")
    commit(ovl.inspect(), ovl.upper, ovl.root)
    leftovers = [k for k in snapshot(ovl.root) if TEMP_PREFIX in k]
    assert leftovers == []
    assert (ovl.root / "deep" / "er" / "f").read_text() == "f"


def test_symlinked_write_root_is_a_problem(ovl: Overlay, tmp_path: Path) -> None:
    with ovl as m:
        (m / "a").write_text("a")
    link = tmp_path / "link"
    link.symlink_to(ovl.root)
    ins = ovl.inspect(write_root=link)
    assert not ins.ok and "without following links" in ins.problems[0]
    with pytest.raises(CommitError, match="without links"):
        commit(Inspection(files=(), problems=(), bytes_total=0), ovl.upper, link)


def test_check_write_root(tmp_path: Path) -> None:
    real = Path(os.path.realpath(tmp_path))
    (real / "file").write_text("")
    (real / "link").symlink_to(real)
    assert check_write_root(str(real)) is None
    assert "not absolute" in str(check_write_root("relative/dir"))
    assert "filesystem root" in str(check_write_root("/"))
    assert "not canonical" in str(check_write_root(f"{real}/link"))
    assert "not canonical" in str(check_write_root(f"{real}/../{real.name}"))
    assert "not canonical" in str(check_write_root(f"{real}/"))
    assert "create the directory" in str(check_write_root(f"{real}/missing"))
    assert "not a directory" in str(check_write_root(f"{real}/file"))
