"""Compile a resolved fs profile to a macOS sandbox profile (SBPL) for ``sandbox-exec -f``.

The input is the object the Linux path enforces (:class:`fsprofile.EffectiveProfile`,
its rules resolved against the action's working area), plus what the class itself
grants (the pinned program, the areas it writes whole, a C3 write root, the relay).
Rule by rule (policy ADR-011/012):

* a tree rule ``/a/**`` is ``(subpath "/a")``; a literal rule is ``(literal …)``;
* any other rule (``**/*.env``, ``/home/*/.ssh/**``) is ``(regex #"^…$")``, an exact
  POSIX ERE translation of the glob, so a deny by pattern never denies the directory
  that contains it;
* read rules keep their order (ADR-004, last match wins); a read deny also denies
  writes there, as the Linux masks (read-only empty tmpfs) do;
* modify rules apply only inside the C3 write root, intersected with it;
* network is denied except the relay's loopback ports or unix sockets.

SBPL is last-match-wins among rules that filter on a path, as the policy is: a later
filtered ``deny`` overrides an earlier ``allow`` for the same path and vice versa,
while an unfiltered rule (``(deny default)``, ``(deny network*)``) never overrides a
filtered one. Measured with ``sandbox-exec`` in microsoft/mxc#754 ("allow then deny,
same path: EPERM; deny then allow: CONNECT_OK"; "an unfiltered rule never overrides
a path-filtered one"), and stated in Apple's Sandbox Guide v1.0 (reverse.put.as).

What cannot be written exactly is refused with :class:`SbplError` (code
``sbpl-unexpressible``), never loosened: control or non-ASCII characters (APFS
compares names normalization-insensitively, a sandbox rule does not), and in a
pattern ``"``, ``\\`` and ``^``, which have no escape both ERE and the ``#"…"``
reader agree on.

>>> from sensorium.connectors.os.run.sandbox.fsprofile import EffectiveProfile
>>> glob_to_ere("/**/*.env")
'^(/[^/]+)*/[^/]*[.]env$'
>>> p = EffectiveProfile(name="x", read=("/usr/**", "!**/*.env"), modify=())
>>> text = compile_sbpl(SbplInput(profile=p, base="/w", executable="/bin/ls"))
>>> '(deny file-read* file-write* (regex #"^(/[^/]+)*/[^/]*[.]env$"))' in text
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# The same resolution and segment semantics the Linux path matches with.
from sensorium.connectors.os.run.sandbox.fsprofile import (
    EffectiveProfile,
    _glob,
    _resolve,
    _segments,
)

CODE = "sbpl-unexpressible"
# macOS resolves these through symlinks into /private; a rule matches the resolved path,
# so a rule naming one is emitted for both spellings (never only the one that misses).
PRIVATE_LINKS = ("/etc", "/tmp", "/var")
# ERE metacharacters written as one-character bracket expressions: no backslash needed.
_BRACKETED = frozenset(".[]{}()+|$*?")
_REFUSED_IN_PATTERN = {'"': "a double quote", "\\": "a backslash", "^": "a caret"}

# What any program needs to start on macOS, kept explicit. Sources: Chromium's
# sandbox/policy/mac/common.sb, Bazel's darwin-sandbox and Nix's sandbox-defaults.sb
# (read /usr/lib, /System/Library; sysctl-read; a few mach services).
_SYSTEM_READ = (
    "/usr/lib",  # dyld, libSystem and the other system dylibs
    "/usr/share/locale",  # locale data the C library reads for LC_*
    "/usr/share/zoneinfo",  # what /etc/localtime points into
    "/System/Library",  # frameworks; the dyld shared cache up to macOS 12
    "/System/Volumes/Preboot/Cryptexes/OS",  # the dyld shared cache from macOS 13
    "/private/var/db/timezone",  # the zoneinfo macOS actually links to
    "/private/var/db/dyld",  # dyld's closures and caches on older releases
)
_SYSTEM_LITERAL = (
    "/private/etc/localtime",
    "/dev/null",
    "/dev/zero",
    "/dev/random",
    "/dev/urandom",
)
_DEVICES_RW = ("/dev/null",)  # as DEVICES_FULL on Linux
_MACH_SERVICES = (
    "com.apple.system.opendirectoryd.libinfo",  # getpwuid/getgrgid: `ls -l` owner names
    "com.apple.system.opendirectoryd.membership",  # group membership checks
    "com.apple.system.notification_center",  # notify(3): timezone and locale changes
    "com.apple.system.logger",  # asl, which libSystem may open at start
    "com.apple.logd",  # os_log
)


class SbplError(ValueError):
    """A path or rule SBPL cannot express exactly; the action must not run."""

    code = CODE

    def __init__(self, what: str, why: str) -> None:
        self.what = what
        super().__init__(f"{CODE}: {what}: {why}; the action does not run on macOS")


@dataclass(frozen=True)
class SbplInput:
    """One spawn's sandbox: the resolved profile and what the class adds to it."""

    profile: EffectiveProfile
    base: str  # the action's working area, where './' rules resolve
    executable: str  # the one program the sandbox may exec (binary or interpreter)
    full: tuple[str, ...] = ()  # read and written whole: scratch, artifact dir
    write_root: str | None = None  # C3: modify rules apply inside it, and only there
    relay_ports: tuple[int, ...] = ()  # egress: the relay's loopback TCP ports
    relay_sockets: tuple[str, ...] = ()  # egress: the relay's unix socket paths


def _check(text: str, what: str) -> None:
    for ch in text:
        if not (" " <= ch <= "~"):
            why = f"contains {ch!r}; only printable ASCII is written into a sandbox profile"
            raise SbplError(what, why)


def quote(path: str, what: str = "path") -> str:
    """``path`` as an SBPL string literal: exact, with '"' and '\\' escaped.

    >>> quote('/a "b"/c\\\\d')
    '"/a \\\\"b\\\\"/c\\\\\\\\d"'
    """
    _check(path, what)
    if not path.startswith("/"):
        raise SbplError(what, f"{path!r} is not an absolute path")
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def glob_to_ere(pattern: str) -> str:
    """The anchored POSIX ERE matching exactly the normalized paths ``pattern`` names.

    ``pattern`` is absolute and resolved, as fsprofile matches it: '**' is zero or more
    whole segments, '*' any run of characters but '/', '?' one character but '/'.
    """
    _check(pattern, f"rule {pattern!r}")
    for ch, name in _REFUSED_IN_PATTERN.items():
        if ch in pattern:
            raise SbplError(f"rule {pattern!r}", f"contains {name}, which no regex writes safely")
    segments = _segments(pattern)
    if all(s == "**" for s in segments):  # names the root too, which has no segment
        return "^/$" if not segments else "^(/|(/[^/]+)+)$"
    out = ["^"]
    for segment in segments:
        if segment == "**":
            out.append("(/[^/]+)*")
            continue
        out.append("/")
        if segment == "*":  # a whole segment: never empty, as a path has no empty one
            out.append("[^/]+")
            continue
        for ch in segment:
            if ch == "*":
                out.append("[^/]*")
            elif ch == "?":
                out.append("[^/]")
            else:
                out.append(f"[{ch}]" if ch in _BRACKETED else ch)
    return "".join(out) + "$"


def _variants(pattern: str) -> list[str]:
    """``pattern`` and, for each of /etc, /tmp, /var its first segment names, the same
    rule under /private: macOS checks the resolved path, so without it a deny would miss.
    A wildcard first segment gets one variant per link it matches, and no other."""
    first, _, rest = pattern[1:].partition("/")
    out = [pattern]
    if first == "**":
        return out  # '**' already matches under /private
    for link in PRIVATE_LINKS:
        if _glob(first, link[1:]):
            out.append(f"/private{link}" + (f"/{rest}" if rest else ""))
    return out


def _tree(path: str, what: str) -> str:
    """``(subpath …)`` for a literal directory (and its /private spelling)."""
    quote(path, what)
    if os.path.normpath(path) != path:
        raise SbplError(what, f"{path!r} is not a normalized path")
    trees = [f"(subpath {quote(v, what)})" for v in _literal_variants(path)]
    return trees[0] if len(trees) == 1 else f"(require-any {' '.join(trees)})"


def _literal_variants(path: str) -> list[str]:
    for link in PRIVATE_LINKS:
        if path == link or path.startswith(link + "/"):
            return [path, "/private" + path]
    return [path]


def path_filter(pattern: str) -> str:
    """The SBPL filter naming exactly the paths of the resolved ``pattern``."""
    filters: list[str] = []
    for variant in _variants(pattern):
        segments = _segments(variant)
        wild = [i for i, s in enumerate(segments) if "*" in s or "?" in s]
        literal = "/" + "/".join(segments[: wild[0]] if wild else segments)
        if not wild:
            filters.append(f"(literal {quote(literal, f'rule {pattern!r}')})")
        elif wild == [len(segments) - 1] and segments[-1] == "**":
            filters.append(f"(subpath {quote(literal, f'rule {pattern!r}')})")
        else:
            filters.append(f'(regex #"{glob_to_ere(variant)}")')
    return filters[0] if len(filters) == 1 else f"(require-any {' '.join(filters)})"


def _literals(op: str, paths: tuple[str, ...], kind: str = "literal") -> str:
    rows = "".join(f"\n  ({kind} {quote(p)})" for p in paths)
    return f"({op}{rows})"


def baseline(executable: str) -> list[str]:
    """What the program needs to exist at all: exec itself, load, tell the time."""
    exe = quote(executable, "executable")
    return [
        ";; baseline: start the pinned program and nothing else",
        f"(allow process-exec (literal {exe}))",
        f"(allow file-read* (literal {exe}))",
        "(allow process-fork)  ; as on Linux, where RLIMIT_NPROC bounds it",
        "(allow signal (target self))",
        "(allow sysctl-read)  ; hw.*, kern.* the C library asks at start",
        ";; metadata of every path (realpath, stat of ancestors); a deny below still wins",
        "(allow file-read-metadata)",
        _literals("allow file-read*", _SYSTEM_READ, "subpath"),
        _literals("allow file-read*", _SYSTEM_LITERAL),
        _literals("allow file-write*", _DEVICES_RW),
        "(allow mach-lookup" + "".join(f'\n  (global-name "{s}")' for s in _MACH_SERVICES) + ")",
    ]


def compile_sbpl(spec: SbplInput) -> str:
    """The SBPL text enforcing ``spec``; raises :class:`SbplError` rather than loosen it."""
    lines = ["(version 1)", "(deny default)", *baseline(spec.executable)]
    lines.append(";; areas the class reads and writes whole")
    for area in spec.full:
        lines.append(f"(allow file-read* file-write* {_tree(area, 'area')})")
    if spec.write_root is not None:
        root = _tree(spec.write_root, "write root")
        lines.append(";; modify rules, in order, inside the write root only")
        for rule in spec.profile.modify:
            negated, body = rule.startswith("!"), rule.removeprefix("!")
            where = path_filter(_resolve(body, spec.base))
            if negated:
                lines.append(f"(deny file-write* {where})")
            else:
                lines.append(f"(allow file-write* (require-all {root} {where}))")
    # After the writes: a read deny then also wins over every write allow above.
    lines.append(";; read rules, in order: the last match wins (ADR-004)")
    for rule in spec.profile.read:
        negated, body = rule.startswith("!"), rule.removeprefix("!")
        where = path_filter(_resolve(body, spec.base))
        lines.append(
            f"(deny file-read* file-write* {where})" if negated else f"(allow file-read* {where})"
        )
    lines.append(";; network: none, but the egress relay's own endpoints")
    lines.append("(deny network*)")
    for port in spec.relay_ports:
        if not 0 < port < 65536:
            raise SbplError(f"relay port {port}", "is not a TCP port")
        lines.append(f'(allow network-outbound (remote ip "localhost:{port}"))')
    for sock in spec.relay_sockets:
        lines.append(f"(allow network-outbound (remote unix-socket (path-literal {quote(sock)})))")
    return "\n".join(lines) + "\n"
