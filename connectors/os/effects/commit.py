"""C3: commit an inspected upper layer to write_root, all or nothing — across a crash too.

Phase 1 copies each written file into a hidden temp sibling, re-checking the sha256
:func:`~sensorium.connectors.os.effects.fswrite.inspect` saw. Phase 2 only renames: old
entries go aside into a trash directory inside write_root, so a failure can rename
every step back. Before phase 1 the whole plan (each file's temp and aside name,
the directories phase 1 will make) is written to ``journal.json`` in the trash
directory and synced; ``swapping`` marks phase 2 begun, ``committed`` its end. A
connector killed anywhere in between leaves a journal :func:`recover` finishes at
the next start, before anything is served: forward when ``committed`` is there,
back to the old tree otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

from sensorium.connectors.os.effects.fswrite import (
    _CREATE,
    _DIR,
    _READ,
    TEMP_PREFIX,
    CommitError,
    Inspection,
    _hash_fd,
    _lstat,
    _open_abs,
    _open_dir,
    _split,
)
from sensorium.shared.wire.outcome import FileTouched

JOURNAL, SWAPPING, COMMITTED = "journal.json", "swapping", "committed"
TRASH_SUFFIX = "trash"


def _same_owner_and_mode(fd: int, like: os.stat_result) -> None:
    """What the action wrote stays the action's: the next run may rewrite it."""
    os.fchown(fd, like.st_uid, like.st_gid)
    os.fchmod(fd, like.st_mode & 0o777)


def _durable(dir_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.fsync(dir_fd)


def commit(inspection: Inspection, upper: Path | int, write_root: Path) -> None:
    """Apply an ``ok`` inspection to write_root: all of it or, on CommitError, none of it."""
    if not inspection.ok:
        raise ValueError(f"refusing to commit an inspection with problems: {inspection.problems}")
    try:
        root_fd = _open_abs(write_root)
    except OSError as exc:
        raise CommitError(f"cannot open write_root {write_root} without links: {exc}") from exc
    try:
        _Committer(root_fd, upper).run(inspection.files)
    finally:
        os.close(root_fd)


class _Committer:
    def __init__(self, root_fd: int, upper: Path | int) -> None:
        self.root_fd, self.upper, token = root_fd, upper, secrets.token_hex(8)
        self.temp = f"{TEMP_PREFIX}{token}-"
        self.trash, self.trash_fd = f"{self.temp}{TRASH_SUFFIX}", -1
        self.temps: dict[str, str] = {}  # path -> temp name beside it
        self.made: list[tuple[list[str], str, bool]] = []  # (parents, name, is_dir) in order
        self.undo: list[tuple[bool, list[str], str, str]] = []  # (installed, parents, name, other)

    def _plan(self, files: tuple[FileTouched, ...]) -> dict[str, Any]:
        """Everything a recovery needs, decided before anything is touched."""
        entries, dirs = [], []
        for i, f in enumerate(files):
            parents, name = _split(f.path)
            if not f.deleted:
                self.temps[f.path] = f"{self.temp}{i}-{name}"[:255]
                fd = os.dup(self.root_fd)
                try:
                    for j, part in enumerate(parents):
                        if _lstat(fd, part) is None:
                            if [parents[:j], part] not in dirs:
                                dirs.append([parents[:j], part])
                            break
                        try:
                            nxt = os.open(part, _DIR, dir_fd=fd)
                        except OSError:
                            break  # a link or no directory: phase 1 refuses it, by name
                        os.close(fd)
                        fd = nxt
                finally:
                    os.close(fd)
            entries.append(
                {
                    "path": f.path,
                    "temp": self.temps.get(f.path),
                    "aside": str(i),
                    "deleted": f.deleted,
                }
            )
        return {"files": entries, "dirs": dirs}

    def run(self, files: tuple[FileTouched, ...]) -> None:
        try:
            os.mkdir(self.trash, 0o700, dir_fd=self.root_fd)
            self.made.append(([], self.trash, True))
            self.trash_fd = os.open(self.trash, _DIR, dir_fd=self.root_fd)
            os.fsync(self.root_fd)
            _durable(self.trash_fd, JOURNAL, json.dumps(self._plan(files)).encode())
            self._prepare([f for f in files if not f.deleted])
            _durable(self.trash_fd, SWAPPING, b"")
        except Exception as exc:
            if self.trash_fd >= 0:
                os.close(self.trash_fd)
            self._cleanup()
            raise CommitError(f"commit failed, write_root is unchanged: {exc}") from exc
        try:
            self._swap(files)
            for parents in {tuple(p) for _, p, _, _ in self.undo}:
                fd = _open_dir(self.root_fd, parents)
                os.fsync(fd)
                os.close(fd)
            _durable(self.trash_fd, COMMITTED, b"")
        except Exception as exc:
            if failed := self._rollback():
                raise CommitError(
                    f"commit failed ({exc}) and could not roll back {', '.join(failed)}: "
                    f"the old entries are in {self.trash} in write_root, restore them by hand"
                ) from exc
            self._cleanup()
            raise CommitError(f"commit failed, every change was rolled back: {exc}") from exc
        finally:
            os.close(self.trash_fd)
        try:
            shutil.rmtree(self.trash, dir_fd=self.root_fd)
            os.fsync(self.root_fd)
        except OSError as exc:
            raise CommitError(f"committed, but could not tidy {self.trash}: {exc}") from exc

    def _prepare(self, writes: list[FileTouched]) -> None:
        upper_fd = _open_abs(self.upper)
        try:
            for f in writes:
                parents, name = _split(f.path)
                src_dir = _open_dir(upper_fd, parents)
                try:
                    dst_dir = self._ensure_dir(upper_fd, parents)
                    try:
                        self._copy(f, src_dir, name, dst_dir, self.temps[f.path])
                    finally:
                        os.close(dst_dir)
                finally:
                    os.close(src_dir)
        finally:
            os.close(upper_fd)

    def _ensure_dir(self, upper_fd: int, parents: list[str]) -> int:
        """Open (making what is missing) the directory ``parents`` in write_root."""
        fd = os.dup(self.root_fd)
        try:
            for i, part in enumerate(parents):
                try:
                    nxt = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o700, dir_fd=fd)
                    self.made.append((parents[:i], part, True))
                    nxt = os.open(part, _DIR, dir_fd=fd)
                    up = _open_dir(upper_fd, parents[: i + 1])
                    _same_owner_and_mode(nxt, os.fstat(up))
                    os.close(up)
                except OSError as exc:
                    where = "/".join(parents[: i + 1])
                    raise CommitError(
                        f"{where} in write_root is a symlink or no directory"
                    ) from exc
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _copy(self, f: FileTouched, src_dir: int, name: str, dst_dir: int, temp: str) -> None:
        src = os.open(name, _READ, dir_fd=src_dir)
        try:
            out = os.open(temp, _CREATE, 0o600, dir_fd=dst_dir)
            self.made.append((_split(f.path)[0], temp, False))
            try:
                if _hash_fd(src, f.bytes + 1, out) != (f.bytes, f.sha256):
                    raise CommitError(f"{f.path} changed in the upper layer since inspection")
                _same_owner_and_mode(out, os.fstat(src))
                os.fsync(out)
            finally:
                os.close(out)
            os.fsync(dst_dir)
        finally:
            os.close(src)

    def _swap(self, files: tuple[FileTouched, ...]) -> None:
        for i, f in enumerate(files):
            parents, name = _split(f.path)
            try:
                dfd = _open_dir(self.root_fd, parents)
            except FileNotFoundError:
                if f.deleted:  # already gone
                    continue
                raise
            try:
                if _lstat(dfd, name) is not None:
                    aside = str(i)
                    os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=self.trash_fd)
                    self.undo.append((False, parents, name, aside))
                if not f.deleted:
                    os.rename(self.temps[f.path], name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    self.undo.append((True, parents, name, self.temps[f.path]))
            finally:
                os.close(dfd)

    def _rollback(self) -> list[str]:
        failed = []
        for installed, parents, name, other in reversed(self.undo):
            try:
                dfd = _open_dir(self.root_fd, parents)
                try:
                    if installed:  # back to its temp name, which _cleanup removes
                        os.rename(name, other, src_dir_fd=dfd, dst_dir_fd=dfd)
                    else:
                        os.rename(other, name, src_dir_fd=self.trash_fd, dst_dir_fd=dfd)
                finally:
                    os.close(dfd)
            except OSError:
                failed.append("/".join([*parents, name]))
        return failed

    def _cleanup(self) -> None:
        """Remove temps and the directories phase 1 made; write_root is already intact."""
        for parents, name, is_dir in reversed(self.made):
            try:
                fd = _open_dir(self.root_fd, parents)
                try:
                    if is_dir and name == self.trash:
                        shutil.rmtree(name, dir_fd=fd)
                    else:
                        (os.rmdir if is_dir else os.unlink)(name, dir_fd=fd)
                finally:
                    os.close(fd)
            except OSError:
                pass


# --- after a crash ------------------------------------------------------------------------


def recover(write_root: Path) -> list[str]:
    """Finish or undo every commit a killed connector left in ``write_root``; what was done,
    one line each (nothing when there was nothing to do)."""
    try:
        root_fd = _open_abs(write_root)
    except OSError:
        return []
    done = []
    try:
        for entry in sorted(os.listdir(root_fd)):
            if entry.startswith(TEMP_PREFIX) and entry.endswith(f"-{TRASH_SUFFIX}"):
                done.append(f"{write_root}: {_recover_one(root_fd, entry)}")
    finally:
        os.close(root_fd)
    return done


def _recover_one(root_fd: int, trash: str) -> str:
    trash_fd = os.open(trash, _DIR, dir_fd=root_fd)
    try:
        names = set(os.listdir(trash_fd))
        try:
            with open(os.open(JOURNAL, _READ, dir_fd=trash_fd), "rb") as f:
                plan = json.loads(f.read())
        except (OSError, ValueError):
            plan = None  # killed before the journal was whole: nothing else was touched
        if plan is not None and COMMITTED in names:
            verdict = "committed before the crash: finished (the old entries removed)"
        elif plan is not None:
            if SWAPPING in names:
                _undo_swaps(root_fd, trash_fd, plan)
            _remove_made(root_fd, plan)
            verdict = "interrupted before it committed: rolled back, write_root as before"
        else:
            verdict = "interrupted before its journal: nothing had changed; tidied"
    finally:
        os.close(trash_fd)
    shutil.rmtree(trash, dir_fd=root_fd)
    os.fsync(root_fd)
    return f"{trash} {verdict}"


def _undo_swaps(root_fd: int, trash_fd: int, plan: dict[str, Any]) -> None:
    for entry in reversed(plan["files"]):
        parents, name = _split(entry["path"])
        try:
            dfd = _open_dir(root_fd, parents)
        except OSError:
            continue
        try:
            temp, aside = entry["temp"], entry["aside"]
            installed = (
                temp is not None and _lstat(dfd, temp) is None and (_lstat(dfd, name) is not None)
            )
            if installed:  # the new file is in place: back to its temp name
                os.rename(name, temp, src_dir_fd=dfd, dst_dir_fd=dfd)
            if _lstat(trash_fd, aside) is not None:
                os.rename(aside, name, src_dir_fd=trash_fd, dst_dir_fd=dfd)
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _remove_made(root_fd: int, plan: dict[str, Any]) -> None:
    """The temps phase 1 wrote, and the directories it made (now empty again)."""
    for entry in plan["files"]:
        if entry["temp"] is None:
            continue
        parents, _name = _split(entry["path"])
        with contextlib.suppress(OSError):
            dfd = _open_dir(root_fd, parents)
            try:
                os.unlink(entry["temp"], dir_fd=dfd)
            finally:
                os.close(dfd)
    for parents, name in reversed(plan["dirs"]):
        with contextlib.suppress(OSError):
            dfd = _open_dir(root_fd, parents)
            try:
                # Only what phase 1 made and left empty; bottom-up.
                for sub in sorted(_walk_dirs(dfd, name), key=len, reverse=True):
                    os.rmdir(sub, dir_fd=dfd)
            finally:
                os.close(dfd)


def _walk_dirs(dfd: int, name: str, depth: int = 0) -> list[str]:
    """``name`` and every directory beneath it (links not followed), relative to ``dfd``."""
    out = [name]
    if depth > 64:
        return out
    try:
        fd = os.open(name, _DIR, dir_fd=dfd)
    except OSError:
        return out
    try:
        for child in os.listdir(fd):
            st = _lstat(fd, child)
            if st is not None and stat.S_ISDIR(st.st_mode):
                out += [f"{name}/{c}" for c in _walk_dirs(fd, child, depth + 1)]
    finally:
        os.close(fd)
    return out
