"""C3 scoped-fs-write: inspect an overlay's upper layer after the run, then commit all or nothing.

The action saw ``write_root`` through an overlay whose upper layer is a directory on a
capped tmpfs. After it exits the connector calls :func:`inspect`, and :func:`commit`
only when the inspection is ``ok``. Nothing here follows a symbolic link: every path
is walked one component at a time from a directory fd opened with ``O_NOFOLLOW``.

``path_pattern`` is the catalog's regex in RE2 syntax, fully matched in linear time
(``shared.patterns``) against the relative path (``dir/file``, no leading ``./``).
Deletions are checked too; a deleted directory checks every path beneath it.

>>> check_write_root("/srv/../etc")
"write_root '/srv/../etc' is not canonical (it is really '/etc')"
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sensorium.shared import patterns
from sensorium.shared.wire.outcome import FileTouched

__all__ = ["TEMP_PREFIX", "CommitError", "Inspection", "check_write_root", "inspect"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 16
_MAX_PROBLEMS = 50
_MAX_DEPTH = 64  # bounds recursion and open fds against a hostile tree
_KINDS = {stat.S_IFLNK: "symlink", stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket"}
TEMP_PREFIX = ".sensorium-commit-"  # what a crash mid-commit leaves behind in write_root


class CommitError(Exception):
    """The commit failed; the message says whether write_root was left unchanged."""


@dataclass(frozen=True)
class Inspection:
    """What the run wrote: ``files`` sorted by path, ``problems`` that forbid a commit."""

    files: tuple[FileTouched, ...]
    problems: tuple[str, ...]
    bytes_total: int

    @property
    def ok(self) -> bool:
        return not self.problems


def check_write_root(path: str) -> str | None:
    """Why ``path`` cannot be a C3 write root, or None when it can (used at catalog load)."""
    if not os.path.isabs(path):
        return f"write_root {path!r} is not absolute: declare an absolute path"
    if (real := os.path.realpath(path)) != path:
        return f"write_root {path!r} is not canonical (it is really {real!r})"
    if path == "/":
        return "write_root '/' is the filesystem root: declare a dedicated directory"
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return None
    except OSError as exc:
        return f"write_root {path!r} cannot be used ({exc.strerror}): create the directory first"
    return f"write_root {path!r} is not a directory"


def _open_dir(base_fd: int, parts: Sequence[str]) -> int:
    """Open the directory ``parts`` beneath ``base_fd``; a symlink on the way fails."""
    fd = os.dup(base_fd)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise ValueError(f"bad path component {part!r}")
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_abs(path: Path | int) -> int:
    """A directory by absolute path without following links, or a copy of a directory fd
    (an upper layer the sandbox handed back, whose mount no path reaches)."""
    if isinstance(path, int):
        return os.dup(path)
    root = os.open("/", _DIR)
    try:
        return _open_dir(root, Path(os.path.abspath(path)).parts[1:])
    finally:
        os.close(root)


def _split(rel: str) -> tuple[list[str], str]:
    parts = rel.split("/")
    return parts[:-1], parts[-1]


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _xattr(fd: int, name: str) -> bytes | None:
    try:
        return os.getxattr(fd, name)
    except OSError:  # ENODATA: absent
        return None


def inspect(
    upper: Path | int,
    *,
    write_root: Path,
    max_bytes_total: int,
    max_bytes_per_file: int,
    path_pattern: str | None,
    may_modify: Callable[[str], bool],
    xattr_prefix: str = "trusted.overlay.",
    max_files: int | None = None,
) -> Inspection:
    """Classify the upper layer against write_root, the caps and the policy; every problem.

    ``xattr_prefix`` is ``"user.overlay."`` when the overlay was mounted with ``userxattr``.
    """
    pattern = patterns.compile(path_pattern) if path_pattern is not None else None
    try:
        upper_fd = _open_abs(upper)
    except OSError as exc:
        return Inspection(
            files=(), problems=(f"cannot open upper layer {upper}: {exc}",), bytes_total=0
        )
    try:
        root_fd = _open_abs(write_root)
    except OSError as exc:
        os.close(upper_fd)
        problem = f"cannot open write_root {write_root} without following links: {exc}"
        return Inspection(files=(), problems=(problem,), bytes_total=0)
    ins = _Inspector(root_fd, write_root, pattern, may_modify, max_bytes_per_file, xattr_prefix)
    try:
        ins.walk(upper_fd, "", _xattr(upper_fd, xattr_prefix + "opaque") == b"y", 0)
    finally:
        os.close(upper_fd)
        os.close(root_fd)
    problems = ins.problems
    if ins.total > max_bytes_total:
        problems.insert(0, f"{ins.total} bytes written, over max_bytes_total {max_bytes_total}")
    if max_files is not None and len(ins.files) > max_files:
        problems.insert(0, f"{len(ins.files)} files touched, over fs_write.max_files {max_files}")
    if len(problems) > _MAX_PROBLEMS:
        problems[_MAX_PROBLEMS:] = [f"and {len(problems) - _MAX_PROBLEMS} more"]
    files = tuple(sorted(ins.files, key=lambda f: f.path))
    return Inspection(files=files, problems=tuple(problems), bytes_total=ins.total)


@dataclass
class _Inspector:
    root_fd: int
    write_root: Path
    pattern: patterns.Pattern | None
    may_modify: Callable[[str], bool]
    max_per_file: int
    prefix: str
    files: list[FileTouched] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    total: int = 0

    def problem(self, path: str, what: str) -> None:
        self.problems.append(f"{path or '.'}: {what}")

    def walk(self, fd: int, rel: str, opaque: bool, depth: int) -> None:
        names = sorted(os.listdir(fd))
        if opaque:  # this upper dir replaced write_root's: whatever it lacks is deleted
            for name in sorted(set(self._old_names(rel)) - set(names)):
                self._deleted(f"{rel}/{name}" if rel else name)
        for name in names:
            path = f"{rel}/{name}" if rel else name
            try:
                self._entry(fd, name, path, opaque, depth)
            except OSError as exc:
                self.problem(path, f"cannot inspect ({exc.strerror or exc})")

    def _entry(self, fd: int, name: str, path: str, opaque: bool, depth: int) -> None:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        old = self._target(path)
        if stat.S_ISDIR(st.st_mode):
            if old is not None and not stat.S_ISDIR(old.st_mode):
                return self.problem(path, "replaces a non-directory — C3 commits no type change")
            if depth >= _MAX_DEPTH:
                return self.problem(path, f"nested deeper than {_MAX_DEPTH} directories")
            sub = os.open(name, _DIR, dir_fd=fd)
            try:
                if _xattr(sub, self.prefix + "redirect") is not None:
                    self.problem(path, "renamed directory — mount with redirect_dir=off")
                sub_opaque = opaque or _xattr(sub, self.prefix + "opaque") == b"y"
                self.walk(sub, path, sub_opaque, depth + 1)
            finally:
                os.close(sub)
        elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # overlay whiteout
            self._deleted(path)
        elif not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "device")
            self.problem(path, f"{kind} — C3 commits regular files only")
        else:
            if old is not None and stat.S_ISDIR(old.st_mode):
                self.problem(path, "replaces a directory — C3 commits no type change")
            self._written(fd, name, path, st)
        return None

    def _written(self, fd: int, name: str, path: str, st: os.stat_result) -> None:
        self._check_path(path)
        if st.st_nlink > 1:
            self.problem(path, f"{st.st_nlink} hard links — C3 commits single-name files only")
        size, digest = st.st_size, None
        if size <= self.max_per_file:
            src = os.open(name, _READ, dir_fd=fd)
            try:
                if _xattr(src, self.prefix + "metacopy") is not None:
                    self.problem(path, "metadata-only copy-up — mount with metacopy=off")
                size, digest = _hash_fd(src, self.max_per_file + 1)
            finally:
                os.close(src)
        if size > self.max_per_file:
            self.problem(path, f"{size} bytes, over max_bytes_per_file {self.max_per_file}")
            digest = None
        self.total += size
        self.files.append(FileTouched(path=path, bytes=size, sha256=digest))

    def _deleted(self, path: str) -> None:
        old = self._target(path)
        if old is None:  # absent from write_root: deleting it changes nothing
            return
        self._check_path(path)
        if stat.S_ISDIR(old.st_mode):
            self._check_beneath(path, 0)
        self.files.append(FileTouched(path=path, bytes=0, sha256=None, deleted=True))

    def _check_beneath(self, rel: str, depth: int) -> None:
        if depth >= _MAX_DEPTH:
            return self.problem(rel, f"nested deeper than {_MAX_DEPTH} directories")
        fd = _open_dir(self.root_fd, rel.split("/"))
        try:
            for name in sorted(os.listdir(fd)):
                self._check_path(f"{rel}/{name}")
                if (st := _lstat(fd, name)) is not None and stat.S_ISDIR(st.st_mode):
                    self._check_beneath(f"{rel}/{name}", depth + 1)
        finally:
            os.close(fd)
        return None

    def _check_path(self, path: str) -> None:
        if self.pattern is not None and self.pattern.fullmatch(path) is None:
            self.problem(path, f"does not match path_pattern {self.pattern.pattern!r}")
        if not self.may_modify(absolute := str(self.write_root / path)):
            self.problem(path, f"the fs policy does not allow modifying {absolute}")

    def _target(self, path: str) -> os.stat_result | None:
        """What ``path`` is in write_root now (lstat), None when absent."""
        parents, name = _split(path)
        try:
            fd = _open_dir(self.root_fd, parents)
        except FileNotFoundError:
            return None
        try:
            return _lstat(fd, name)
        finally:
            os.close(fd)

    def _old_names(self, rel: str) -> list[str]:
        try:
            fd = _open_dir(self.root_fd, rel.split("/") if rel else [])
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.problem(rel, f"cannot list it in write_root ({exc.strerror})")
            return []
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)


def _hash_fd(fd: int, limit: int, out: int = -1) -> tuple[int, str]:
    """Size and sha256 of a regular file read to at most ``limit`` bytes, copied to ``out``."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError("not a regular file when opened")
    h, size = hashlib.sha256(), 0
    while size < limit and (chunk := os.read(fd, min(_CHUNK, limit - size))):
        h.update(chunk)
        size += len(chunk)
        view = memoryview(chunk)
        while out >= 0 and view:
            view = view[os.write(out, view) :]
    return size, h.hexdigest()
