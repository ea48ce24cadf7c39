"""C5 promotion: real scratch files become content-addressed lane objects, all or none."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from sensorium.connectors.os.effects.artifacts import (
    Promotion,
    lane_path,
    media_type_allowed,
    promote,
)


def png() -> bytes:
    """A minimal valid 1x1 RGB PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def run(src: Path, lane: Path, **kw: Any) -> Promotion:
    args: dict[str, Any] = {
        "lane": lane,
        "max_count": 10,
        "max_bytes_per": 1 << 20,
        "max_bytes_total": 1 << 20,
        "allowed_media_types": ["text/plain", "image/png"],
    }
    return promote(src, **(args | kw))


def lane_objects(lane: Path) -> list[Path]:
    return sorted(p for p in (lane / "sha256").rglob("*") if p.is_file())


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "scratch"
    d.mkdir()
    return d


@pytest.fixture
def lane(tmp_path: Path) -> Path:
    return tmp_path / "lane"


def test_text_and_png_are_promoted_in_walk_order(src: Path, lane: Path) -> None:
    (src / "b.txt").write_text("hello\n")
    (src / "a").mkdir()
    (src / "a" / "pic.png").write_bytes(png())
    p = run(src, lane, role="screenshot")
    assert p.ok, p.problems
    assert p.names == ("a/pic.png", "b.txt")
    digest = hashlib.sha256(png()).hexdigest()
    assert p.refs[0].id == f"sha256:{digest}"
    assert (p.refs[0].role, p.refs[0].media_type, p.refs[0].size) == (
        "screenshot",
        "image/png",
        len(png()),
    )
    assert (p.refs[1].media_type, p.refs[1].size) == ("text/plain", 6)
    obj = lane_path(lane, p.refs[0].id)
    assert obj == lane / "sha256" / digest[:2] / digest
    assert obj.read_bytes() == png()
    assert stat.S_IMODE(obj.stat().st_mode) == 0o444
    assert list((lane / "tmp").iterdir()) == []


def test_disallowed_type_promotes_nothing(src: Path, lane: Path) -> None:
    (src / "a.txt").write_text("fine\n")
    (src / "b.png").write_bytes(png())
    p = run(src, lane, allowed_media_types=["text/plain"])
    assert not p.ok and p.refs == ()
    assert p.problems == ("b.png: media type image/png is not allowed; nothing promoted",)
    assert lane_objects(lane) == []
    assert list((lane / "tmp").iterdir()) == []


def test_empty_file_is_application_x_empty(src: Path, lane: Path) -> None:
    (src / "empty").write_bytes(b"")
    assert "application/x-empty" in run(src, lane).problems[0]
    p = run(src, lane, allowed_media_types=["application/x-empty"])
    assert p.ok and p.refs[0].size == 0


@pytest.mark.parametrize(
    ("caps", "problem"),
    [
        ({"max_bytes_per": 100}, "big.txt: over max_artifact_bytes_per 100"),
        ({"max_bytes_total": 150}, "big.txt: total over max_artifact_bytes_total 150"),
        ({"max_count": 2}, "c.txt: more than max_artifact_count 2 artifacts"),
    ],
)
def test_caps_promote_nothing(src: Path, lane: Path, caps: dict[str, int], problem: str) -> None:
    (src / "a.txt").write_text("a" * 50)
    (src / "big.txt").write_text("b" * 120)
    (src / "c.txt").write_text("c" * 20)
    p = run(src, lane, **caps)
    assert p.problems == (f"{problem}; nothing promoted",)
    assert p.refs == () and lane_objects(lane) == []
    assert list((lane / "tmp").iterdir()) == []


def test_large_file_over_a_cap_is_refused(src: Path, lane: Path) -> None:
    (src / "big.txt").write_text("x" * 300_000)
    p = run(src, lane, max_bytes_per=200_000)
    assert p.problems == ("big.txt: over max_artifact_bytes_per 200000; nothing promoted",)
    p = run(src, lane, max_bytes_total=200_000)
    assert p.problems == ("big.txt: total over max_artifact_bytes_total 200000; nothing promoted",)


def test_links_fifos_and_sockets_are_skipped_never_read(
    src: Path, lane: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret\n")
    (src / "leak.txt").symlink_to(secret)
    (src / "dirlink").symlink_to(tmp_path)
    os.mkfifo(src / "pipe")  # opening it for reading would block forever
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(src / "sock"))
        (src / "real.txt").write_text("real\n")
        p = run(src, lane)
    finally:
        sock.close()
    assert p.ok, p.problems
    assert p.names == ("real.txt",)
    assert p.skipped == (
        "dirlink: symlink — only regular files are promoted",
        "leak.txt: symlink — only regular files are promoted",
        "pipe: FIFO — only regular files are promoted",
        "sock: socket — only regular files are promoted",
    )
    secret_id = "sha256:" + hashlib.sha256(b"top secret\n").hexdigest()
    assert not lane_path(lane, secret_id).exists()


def test_identical_content_is_stored_once(src: Path, lane: Path) -> None:
    (src / "one.txt").write_text("same\n")
    (src / "two.txt").write_text("same\n")
    p = run(src, lane)
    assert p.refs[0].id == p.refs[1].id
    assert p.names == ("one.txt", "two.txt")
    assert len(lane_objects(lane)) == 1
    again = run(src, lane)  # already in the lane: the existing object is kept
    assert again.refs == p.refs and len(lane_objects(lane)) == 1


def test_wildcard_media_types(src: Path, lane: Path) -> None:
    (src / "a.csv").write_text("a,b\n1,2\n")
    (src / "b.txt").write_text("plain words\n")
    p = run(src, lane, allowed_media_types=["text/*"])
    assert p.ok, p.problems
    assert all(r.media_type is not None and r.media_type.startswith("text/") for r in p.refs)
    assert media_type_allowed("Text/HTML", ["text/*"])
    assert not media_type_allowed("textual/x", ["text/*"])
    assert not media_type_allowed("image/png", ["text/*", "image/jpeg"])


def test_lane_path_rejects_a_bad_id(lane: Path) -> None:
    with pytest.raises(ValueError, match="64 hex"):
        lane_path(lane, "sha256:../../etc/passwd")


def test_source_that_is_a_symlink_is_refused(tmp_path: Path, lane: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    p = run(tmp_path / "link", lane)
    assert not p.ok and "cannot read the scratch area" in p.problems[0]
