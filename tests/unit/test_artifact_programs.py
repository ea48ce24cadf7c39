"""C5 refuses artifacts that are, or carry, a program (issue 16, item 14).

The media type is libmagic's sniff of the first bytes: before this, a PNG header
followed by an ELF binary was promoted as ``image/png``. Real files, real libmagic.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest

from sensorium.connectors.os.effects import execsniff
from sensorium.connectors.os.effects.artifacts import Promotion, promote

CHUNK = 1 << 16  # artifacts reads in chunks of this size


def _png() -> bytes:
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


ELF = Path("/bin/true").read_bytes()
# A Mach-O x86_64 executable's header, and a PE header behind an MZ stub.
MACHO = struct.pack("<IiiIIII", 0xFEEDFACF, 0x01000007, 3, 2, 0, 0, 0)
PE = b"MZ" + b"\0" * 58 + struct.pack("<I", 64) + b"PE\0\0" + struct.pack("<HH", 0x8664, 3)


def _promote(tmp_path: Path, files: dict[str, bytes], allowed: list[str]) -> Promotion:
    src = tmp_path / "scratch"
    src.mkdir()
    for name, body in files.items():
        (src / name).write_bytes(body)
    args: dict[str, Any] = {"max_count": 10, "max_bytes_per": 8 << 20, "max_bytes_total": 8 << 20}
    return promote(src, lane=tmp_path / "lane", allowed_media_types=allowed, **args)


def test_a_png_carrying_an_elf_binary_is_refused(tmp_path: Path) -> None:
    p = _promote(tmp_path, {"cat.png": _png() + ELF}, ["image/png"])
    # Before: promoted as image/png.
    assert not p.ok and p.refs == ()
    [problem] = p.problems
    assert problem.startswith(f"cat.png: carries at byte {len(_png())} an ELF executable")
    assert "allowed_media_types names no ELF type" in problem


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (ELF, "sniffs as application/x-"),
        (b"#!/bin/sh\necho hi\n", "sniffs as text/x-shellscript"),
        (b"#!/opt/unknown\nwhatever\n", "a #! script"),
        (b"\0" * (CHUNK - 7) + MACHO + b"\0" * 100, f"carries at byte {CHUNK - 7} an Mach-O"),
        (b"\0" * 1000 + PE + b"\0" * 100, "carries at byte 1064 an PE executable"),
    ],
)
def test_programs_are_refused_under_wildcards(tmp_path: Path, body: bytes, what: str) -> None:
    p = _promote(tmp_path, {"out": body}, ["application/*", "text/*"])
    assert not p.ok
    assert what in p.problems[0]


def test_a_program_is_promoted_where_its_kind_is_named_exactly(tmp_path: Path) -> None:
    # libmagic names an ELF program by its e_type (x-sharedlib for a PIE, on some hosts).
    ok = _promote(tmp_path, {"true": ELF}, list(execsniff.KINDS["ELF"]))
    assert ok.ok and len(ok.refs) == 1
    assert execsniff.allowed("script", ["text/x-script.python"])
    assert not execsniff.allowed("script", ["text/*"])


def test_random_and_compressed_bytes_are_not_taken_for_programs(tmp_path: Path) -> None:
    rng = random.Random(16)
    blob = rng.randbytes(4 << 20)  # 64 chunks of noise, boundaries included
    p = _promote(tmp_path, {"noise.bin": blob, "img.png": _png()}, ["application/*", "image/png"])
    assert p.ok, p.problems
    # A magic alone is not enough: each header is checked beyond it.
    for magic in (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"PE\0\0"):
        scan = execsniff.Scanner()
        assert scan.feed(b"x" * 10 + magic + b"\xff" * 30, last=True) is None


def test_a_header_split_across_chunks_is_found() -> None:
    for cut in range(1, 20):
        scan = execsniff.Scanner()
        data = b"\0" * 50 + ELF[:64]
        assert scan.feed(data[: 50 + cut]) is None
        found = scan.feed(data[50 + cut :], last=True)
        assert found == execsniff.Program("ELF", 50)
