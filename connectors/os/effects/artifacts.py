"""C5 artifact-producing-spawn: promote a scratch directory into the content-addressed lane.

After the action exits, :func:`promote` walks its per-invocation scratch directory
(sorted, depth first) from directory fds without following links. Only regular files
become artifacts; links, FIFOs, sockets and devices are listed in ``skipped`` and never
opened. Each file is streamed into ``lane/tmp/`` while hashed, counted against the caps
and sniffed with libmagic (a sniff of its first bytes, not a validation of its
format) and scanned whole for a program (``execsniff``: ELF, Mach-O, PE headers
anywhere, ``#!`` at the start), refused unless ``allowed_media_types`` names that
kind of program exactly; any refusal publishes nothing. Objects live at
``lane/sha256/<2 hex>/<64 hex>``, read-only; an existing object is kept (same content).
A lane the disk cannot take (full, read-only) raises ``storage-unavailable``; what
was staged is removed first, so no partial file is left anywhere in the lane.

>>> lane_path(Path("/lane"), "sha256:" + "ab" * 32).parent
PosixPath('/lane/sha256/ab')
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sensorium.connectors.os.effects import execsniff
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.store import storage_error
from sensorium.shared.wire.outcome import EvidenceRef

__all__ = ["Promotion", "lane_path", "media_type_allowed", "promote"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 16
_MAX_DEPTH = 64  # bounds recursion and open fds against a hostile tree
_KINDS = {
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}
_REF_ID = re.compile(r"sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Promotion:
    """Refs in walk order with ``names`` (source-relative paths) parallel to them.

    When ``problems`` is not empty nothing was published and ``refs`` is empty.
    """

    refs: tuple[EvidenceRef, ...] = ()
    names: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def lane_path(lane: Path, ref_id: str) -> Path:
    """Where the object named ``ref_id`` (``sha256:<hex>``) lives in the lane."""
    if (m := _REF_ID.fullmatch(ref_id)) is None:
        raise ValueError(f"{ref_id!r} is not an artifact id: expected 'sha256:' + 64 hex digits")
    return lane / "sha256" / m[1][:2] / m[1]


def media_type_allowed(media_type: str, allowed: Sequence[str]) -> bool:
    """True when ``media_type`` equals an entry or falls under a ``type/*`` entry."""
    media_type = media_type.lower()
    return any(
        a.lower() == media_type or (a.endswith("/*") and media_type.startswith(a[:-1].lower()))
        for a in allowed
    )


class _Refused(Exception):
    """A cap or the media-type set refused the promotion."""


@dataclass
class _Staged:
    name: str
    temp: str
    digest: str
    media_type: str
    size: int


@dataclass
class _Promoter:
    tmp_fd: int
    max_count: int
    max_bytes_per: int
    max_bytes_total: int
    allowed: Sequence[str]
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    staged: list[_Staged] = field(default_factory=list)
    temps: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    total: int = 0

    def walk(self, fd: int, rel: str, depth: int) -> None:
        for name in sorted(os.listdir(fd)):
            path = f"{rel}/{name}" if rel else name
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                if depth >= _MAX_DEPTH:
                    raise _Refused(f"{path}: nested deeper than {_MAX_DEPTH} directories")
                sub = os.open(name, _DIR, dir_fd=fd)
                try:
                    self.walk(sub, path, depth + 1)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(mode):
                self._stage(fd, name, path)
            else:
                self._skip(path, mode)

    def _skip(self, path: str, mode: int) -> None:
        kind = _KINDS.get(stat.S_IFMT(mode), "unknown file type")
        self.skipped.append(f"{path}: {kind} — only regular files are promoted")

    def _stage(self, fd: int, name: str, path: str) -> None:
        # O_NONBLOCK: a FIFO swapped in after the lstat cannot block the open.
        src = os.open(name, _READ, dir_fd=fd)
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):
                return self._skip(path, st.st_mode)
            if len(self.staged) >= self.max_count:
                raise _Refused(f"{path}: more than max_artifact_count {self.max_count} artifacts")
            temp = f"{self.token}-{len(self.temps)}"
            out = os.open(temp, _CREATE, 0o600, dir_fd=self.tmp_fd)
            self.temps.append(temp)
            try:
                digest, media_type, size = self._copy(src, out, path, st.st_size)
                os.fchmod(out, 0o444)
                os.fsync(out)
            finally:
                os.close(out)
        finally:
            os.close(src)
        self.total += size
        self.staged.append(_Staged(path, temp, digest, media_type, size))
        return None

    def _copy(self, src: int, out: int, path: str, claimed: int) -> tuple[str, str, int]:
        """Stream src to out while hashing; refuse before reading past any cap."""
        room = min(self.max_bytes_per, self.max_bytes_total - self.total)
        h, size, media_type = hashlib.sha256(), 0, None
        scan = execsniff.Scanner()
        while True:
            self._check_size(path, max(size, claimed))
            chunk = os.read(src, min(_CHUNK, room - size + 1))
            if media_type is None:
                media_type = _sniff(chunk)
                if not media_type_allowed(media_type, self.allowed):
                    raise _Refused(f"{path}: media type {media_type} is not allowed")
                if (kind := execsniff.executable_kind(media_type)) is not None:
                    self._program(path, kind, f"sniffs as {media_type}")
            if (found := scan.feed(chunk, last=not chunk)) is not None:
                self._program(path, found.kind, str(found))
            if not chunk:
                return h.hexdigest(), media_type, size
            size += len(chunk)
            self._check_size(path, size)
            h.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]

    def _program(self, path: str, kind: str, what: str) -> None:
        if not execsniff.allowed(kind, self.allowed):
            raise _Refused(
                f"{path}: {what}; allowed_media_types names no {kind} type "
                f"({', '.join(execsniff.KINDS[kind])})"
            )

    def _check_size(self, path: str, size: int) -> None:
        if size > self.max_bytes_per:
            raise _Refused(f"{path}: over max_artifact_bytes_per {self.max_bytes_per}")
        if self.total + size > self.max_bytes_total:
            raise _Refused(f"{path}: total over max_artifact_bytes_total {self.max_bytes_total}")

    def publish(self, lane: Path) -> None:
        for s in self.staged:
            shard = lane / "sha256" / s.digest[:2]
            shard.mkdir(parents=True, exist_ok=True)
            try:
                # link, unlike rename, never replaces: an existing object is the same bytes.
                os.link(s.temp, shard / s.digest, src_dir_fd=self.tmp_fd, follow_symlinks=False)
            except FileExistsError:
                pass
            fd = os.open(shard, _DIR)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def discard(self) -> None:
        for temp in self.temps:
            # Nothing more can be done for a temp that cannot go; never mask why we stop.
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self.tmp_fd)


def _sniff(first: bytes) -> str:
    try:
        # Imported here: without libmagic on the node only C5 sniffing fails (and
        # refuses), not the connector.
        import magic

        return str(magic.from_buffer(first, mime=True))
    except Exception:  # libmagic error: unknown is never an allowed type
        return "application/octet-stream"


def promote(
    source: Path | int,
    *,
    lane: Path,
    max_count: int,
    max_bytes_per: int,
    max_bytes_total: int,
    allowed_media_types: Sequence[str],
    role: str = "artifact",
) -> Promotion:
    """Publish every regular file under ``source`` into ``lane``, or none of them.

    Raises ``CodedError`` (``storage-unavailable``) when the lane cannot be written."""
    try:
        (lane / "tmp").mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp_fd = os.open(lane / "tmp", _DIR)
    except OSError as exc:
        raise _unwritable(exc, lane) or exc from None
    p = _Promoter(tmp_fd, max_count, max_bytes_per, max_bytes_total, allowed_media_types)
    try:
        try:
            src_fd = os.dup(source) if isinstance(source, int) else os.open(source, _DIR)
            try:
                p.walk(src_fd, "", 0)
            finally:
                os.close(src_fd)
        except (_Refused, OSError) as exc:
            if isinstance(exc, OSError) and (full := _unwritable(exc, lane)) is not None:
                raise full from None
            what = exc if isinstance(exc, _Refused) else f"cannot read the scratch area: {exc}"
            return Promotion(skipped=tuple(p.skipped), problems=(f"{what}; nothing promoted",))
        try:
            p.publish(lane)
        except OSError as exc:  # objects already linked are complete, just unreferenced
            if (full := _unwritable(exc, lane)) is not None:
                raise full from None
            return Promotion(skipped=tuple(p.skipped), problems=(f"cannot publish: {exc}",))
    finally:
        p.discard()
        os.close(tmp_fd)
    refs = tuple(
        EvidenceRef(id=f"sha256:{s.digest}", role=role, media_type=s.media_type, size=s.size)
        for s in p.staged
    )
    return Promotion(refs=refs, names=tuple(s.name for s in p.staged), skipped=tuple(p.skipped))


def _unwritable(exc: OSError, lane: Path) -> CodedError | None:
    """``storage-unavailable`` when ``exc`` says the lane's disk is full or read-only
    (reading the action's own scratch tmpfs never says that)."""
    if storage_error(exc, lane) is None:
        return None
    return CodedError(
        RuntimeErrorCode.STORAGE_UNAVAILABLE,
        f"the artifact lane {lane} cannot be written ({exc.strerror}); no artifact was kept. "
        "Free space on the state directory's file system or make it writable, then retry",
        retry_after_ms=5000,
        detail={"store": "artifacts"},
    )
