"""C5: is there a program in an artifact? Its start, and every byte after it.

libmagic's media type (``artifacts``) is a sniff of a file's first bytes, not a
validation of its format: a PNG header followed by an ELF binary is ``image/png``.
So, beside it, every artifact is scanned whole while it streams for the headers of
an executable — ELF, Mach-O, PE — checked beyond their magic (class, byte order
and version; CPU type and file type; machine and section count), so that chance
bytes in compressed data do not look like one, and its first bytes for a ``#!``
script. A file that starts as, or carries, a program is refused unless
``allowed_media_types`` names that kind of program by its exact type (a ``type/*``
entry never does): an archive of programs needs such an entry too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# The media types naming each kind of program; libmagic's first.
KINDS: dict[str, tuple[str, ...]] = {
    "ELF": (
        "application/x-executable",
        "application/x-pie-executable",
        "application/x-sharedlib",
        "application/x-object",
        "application/x-elf",
    ),
    "Mach-O": ("application/x-mach-binary",),
    "PE": (
        "application/vnd.microsoft.portable-executable",
        "application/x-dosexec",
        "application/x-msdownload",
    ),
    "script": ("text/x-shellscript", "application/x-shellscript", "text/x-script"),
}
_CANDIDATE = re.compile(rb"\x7fELF|\xcf\xfa\xed\xfe|\xce\xfa\xed\xfe|\xfe\xed\xfa[\xce\xcf]|PE\0\0")
_WINDOW = 20  # bytes a candidate is checked on
_MACHO_CPUS = {7, 12, 18}  # x86, ARM, PowerPC (| 0x01000000 for their 64-bit kinds)
_PE_MACHINES = {0x14C, 0x8664, 0xAA64, 0x1C0, 0x1C4, 0x200, 0x5064}


@dataclass(frozen=True)
class Program:
    kind: str  # a key of KINDS
    offset: int

    def __str__(self) -> str:
        if self.kind == "script":
            return "a #! script"
        where = "starts as" if self.offset == 0 else f"carries at byte {self.offset}"
        return f"{where} an {self.kind} executable"


def _elf(w: bytes) -> bool:
    if w[4] not in (1, 2) or w[5] not in (1, 2) or w[6] != 1:
        return False
    e_type = int.from_bytes(w[16:18], "little" if w[5] == 1 else "big")
    return e_type in (1, 2, 3, 4)  # relocatable, executable, shared object, core


def _macho(w: bytes) -> bool:
    order: Literal["little", "big"] = "little" if w[0] in (0xCE, 0xCF) else "big"
    cpu = int.from_bytes(w[4:8], order)
    filetype = int.from_bytes(w[12:16], order)
    return cpu & 0x00FFFFFF in _MACHO_CPUS and cpu >> 24 in (0, 1) and 1 <= filetype <= 12


def _pe(w: bytes) -> bool:
    machine = int.from_bytes(w[4:6], "little")
    sections = int.from_bytes(w[6:8], "little")
    return machine in _PE_MACHINES and 1 <= sections <= 96


def _check(w: bytes) -> str | None:
    if w.startswith(b"\x7fELF"):
        return "ELF" if _elf(w) else None
    if w.startswith(b"PE"):
        return "PE" if _pe(w) else None
    return "Mach-O" if _macho(w) else None


class Scanner:
    """Fed a file's bytes in order; ``found`` is the first program seen."""

    def __init__(self) -> None:
        self._tail = b""
        self._seen = 0  # bytes fed before ``_tail``
        self.found: Program | None = None

    def feed(self, chunk: bytes, *, last: bool = False) -> Program | None:
        if self.found is not None:
            return self.found
        if self._seen == 0 and not self._tail and chunk.startswith(b"#!"):
            self.found = Program("script", 0)
            return self.found
        buf = self._tail + chunk
        limit = len(buf) if last else max(0, len(buf) - _WINDOW + 1)
        for m in _CANDIDATE.finditer(buf, 0, len(buf)):
            at = m.start()
            if at >= limit:
                break
            window = buf[at : at + _WINDOW]
            if len(window) == _WINDOW and (kind := _check(window)) is not None:
                self.found = Program(kind, self._seen + at)
                return self.found
        # Keep what a candidate still needs: it is checked again with the next chunk.
        keep = len(buf) - limit
        self._seen += len(buf) - keep
        self._tail = buf[len(buf) - keep :]
        return None


def executable_kind(media_type: str) -> str | None:
    """The kind of program libmagic named, if it named one."""
    media_type = media_type.lower()
    for kind, types in KINDS.items():
        if any(media_type == t or media_type.startswith(t + ".") for t in types):
            return kind
    return None


def allowed(kind: str, allowed_media_types: Sequence[str]) -> bool:
    """A program only where its kind is named exactly (``text/x-script.python`` too)."""
    names = [a.lower() for a in allowed_media_types]
    return any(executable_kind(a) == kind for a in names if not a.endswith("/*"))
