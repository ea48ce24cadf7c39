"""Filesystem policy v2: load it, resolve a profile, check paths, plan what a kernel enforces.

The contract is the policy seed's ADR-002..005: v2 only, named ``fsProfiles`` plus global
``denyRead``/``denyModify`` appended as ``!<rule>``, last match wins, default deny, and
every modify rule covered by a read rule of the same profile.

>>> policy = load_policy({"schemaVersion": 2, "denyRead": ["/root/**"]})
>>> profile = effective_profile(policy, None)
>>> check_path(profile.read, "/usr/bin/env", base="/srv/work")
True
>>> check_path(profile.read, "/root/.ssh/id_ed25519", base="/srv/work")
False
>>> compile_read(profile, base="/srv/work")
ReadPlan(grants=('/',), masks=('/root',), gaps=())
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from sensorium.shared.wire.fs_policy import (
    PROFILE_NAME_MAX,
    PROFILE_NAME_PATTERN,
    PROFILES_MAX,
    RULE_MAX,
    RULES_MAX,
    WILDCARD_SEGMENTS_MAX,
    FsPolicy,
)

UNRESTRICTED_FS_PROFILE = "unrestricted"
# The words that mark a gap as looser than the policy (every other gap is stricter).
UNENFORCED = "files it names stay readable"
_PROFILE_NAME = re.compile(PROFILE_NAME_PATTERN)
_TOP_FIELDS = ("schemaVersion", "fsProfiles", "denyRead", "denyModify")
_MIGRATION = (
    'rewrite it as schemaVersion 2: global denials go in "denyRead" and "denyModify" '
    '(lists of rules such as "/root/**"), each named profile goes in "fsProfiles" as '
    '{"<name>": {"read": [...], "modify": [...]}}, and every modify rule needs a read rule '
    "of the same profile covering it; there is no automatic upgrader"
)


class PolicyError(Exception):
    """The fs policy is invalid or names no such profile; ``problems`` lists every one."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {where}: {message}" for where, message in problems)
        super().__init__(f"fs policy has {len(problems)} problem(s):\n{lines}")


# --- loading --------------------------------------------------------------------------


def _rule_problem(rule: object, *, deny: bool) -> str | None:
    if not isinstance(rule, str):
        return 'must be a string rule such as "/usr/**" or "./build/**"'
    if not rule.removeprefix("!"):
        return f'{rule!r} names no path; write a pattern such as "/usr/**"'
    if len(rule) > RULE_MAX:
        return f"is longer than {RULE_MAX} characters"
    if "\x00" in rule:
        return f"{rule!r} contains a NUL byte, which no path can contain"
    if deny and rule.startswith("!"):
        return f"{rule!r}: global denies are negated when applied; drop the leading '!'"
    try:
        _, rest = _split(rule.removeprefix("!"))
    except ValueError as exc:
        return str(exc)
    if sum("*" in s or "?" in s for s in rest.split("/")) > WILDCARD_SEGMENTS_MAX:
        return f"{rule[:80]!r} has more than {WILDCARD_SEGMENTS_MAX} segments with wildcards"
    return None


def _split(body: str) -> tuple[bool, str]:
    """(relative to base?, rest after the anchor); ValueError names what is wrong."""
    if body.startswith("./"):
        relative, rest = True, body[2:]
    elif body.startswith("/"):
        relative, rest = False, body[1:]
    elif body == "**" or body.startswith("**/"):
        relative, rest = False, body  # anchored at the root: '**/x' is '/**/x'
    else:
        raise ValueError(
            f"{body!r} must be absolute ('/…'), relative to the action's working area "
            "('./…') or start with '**/'"
        )
    segments = rest.split("/") if rest else []
    if ".." in segments:
        raise ValueError(f"{body!r} has a '..' segment; name the target path directly")
    if "" in segments or "." in segments:
        raise ValueError(
            f"{body!r} has an empty or '.' segment; rules match normalized paths "
            "(write '/a/b', not '/a//b', '/a/./b' or '/a/')"
        )
    return relative, rest


def _rules(value: object, where: str, problems: list[tuple[str, str]], *, deny: bool) -> None:
    if not isinstance(value, list):
        problems.append((where, "must be a list of rules"))
        return
    if len(value) > RULES_MAX:
        problems.append((where, f"has {len(value)} rules; at most {RULES_MAX} are allowed"))
        return
    for index, rule in enumerate(value):
        if (problem := _rule_problem(rule, deny=deny)) is not None:
            problems.append((f"{where}[{index}]", problem))


def _covers(read: str, modify: str) -> bool:
    """ADR-005 ``rule_covers_path_rule``: structural, on the rule text."""
    if read in (modify, "**", "/**"):
        return True
    prefix = read.removesuffix("/**")
    return prefix != read and (modify == prefix or modify.startswith(prefix + "/"))


def _profile(name: str, body: object, problems: list[tuple[str, str]]) -> None:
    where = f"$.fsProfiles.{name}"
    if not _PROFILE_NAME.fullmatch(name) or len(name) > PROFILE_NAME_MAX:
        problems.append((where, "profile names are a letter then letters, digits, '_' or '-'"))
    if not isinstance(body, dict):
        problems.append((where, 'must be an object {"read": [...], "modify": [...]}'))
        return
    for key in body.keys() - {"read", "modify"}:
        problems.append((f"{where}.{key}", "unknown field; a profile has only read and modify"))
    read, modify = body.get("read", []), body.get("modify", [])
    _rules(read, f"{where}.read", problems, deny=False)
    _rules(modify, f"{where}.modify", problems, deny=False)
    if not (isinstance(read, list) and isinstance(modify, list)):
        return
    if max(len(read), len(modify)) > RULES_MAX:
        return  # said above; the coverage check would be read x modify
    grants = [r for r in read if isinstance(r, str) and not r.startswith("!")]
    for index, rule in enumerate(modify):
        positive = isinstance(rule, str) and rule and not rule.startswith("!")
        if positive and not any(_covers(r, rule) for r in grants):
            why = f"modify rule {rule!r} is not covered by a read rule of profile {name!r}"
            fix = f"add {rule!r} (or a '<parent>/**' containing it) to read"
            problems.append((f"{where}.modify[{index}]", f"{why} (ADR-005); {fix}"))


def load_policy(raw: dict[str, Any] | None) -> FsPolicy:
    """Validate a decoded policy document; ``None`` is the empty v2 policy.

    Raises :class:`PolicyError` listing every problem, each with its JSON path.
    """
    if raw is None:
        return FsPolicy(schemaVersion=2)
    if not isinstance(raw, dict):
        raise PolicyError([("$", "the fs policy must be a JSON object")])
    version = raw.get("schemaVersion")
    if not (type(version) is int and version == 2):
        if type(version) is int and version == 1:
            said = "schemaVersion 1 is no longer accepted"
        elif version is None:
            said = "schemaVersion is missing; only 2 is accepted"
        else:
            said = f"schemaVersion {version!r} is not supported; only 2 is accepted"
        raise PolicyError([("$.schemaVersion", f"{said}; {_MIGRATION}")])
    problems: list[tuple[str, str]] = []
    for key in sorted(raw.keys() - set(_TOP_FIELDS)):
        problems.append((f"$.{key}", f"unknown field; expected one of {', '.join(_TOP_FIELDS)}"))
    for key in ("denyRead", "denyModify"):
        _rules(raw.get(key, []), f"$.{key}", problems, deny=True)
    profiles = raw.get("fsProfiles", {})
    if isinstance(profiles, dict) and len(profiles) > PROFILES_MAX:
        where, why = "$.fsProfiles", f"has {len(profiles)} profiles; at most {PROFILES_MAX}"
        problems.append((where, f"{why} are allowed"))
    elif isinstance(profiles, dict):
        for name, body in profiles.items():
            _profile(str(name), body, problems)
    else:
        problems.append(("$.fsProfiles", 'must be an object {"<name>": {"read": [...], ...}}'))
    if problems:
        raise PolicyError(problems)
    try:
        return msgspec.convert(raw, FsPolicy)
    except msgspec.ValidationError as exc:  # the checks above should have caught it
        raise PolicyError([("$", str(exc))]) from None


# --- resolution and matching ----------------------------------------------------------


@dataclass(frozen=True)
class EffectiveProfile:
    """A profile with the global denies appended: the ordered lists ``check_path`` walks."""

    name: str
    read: tuple[str, ...]
    modify: tuple[str, ...]


def effective_profile(policy: FsPolicy, name: str | None) -> EffectiveProfile:
    """Resolve ``name`` (``None`` = ``"unrestricted"``) and append the global denies (ADR-004)."""
    name = UNRESTRICTED_FS_PROFILE if name is None else name
    rules = policy.fsProfiles.get(name)
    if rules is not None:
        read, modify = list(rules.read), list(rules.modify)
    elif name == UNRESTRICTED_FS_PROFILE:
        # ADR-003 synthesizes read ["./**"]; we deliberately read "/**" instead: a spawned
        # program must read its loader, libraries and locale data, which never live in
        # the working area. Writes stay confined to "./**", and global denies still narrow
        # both lists, so "unrestricted" remains auditable.
        read, modify = ["/**"], ["./**"]
    else:
        known = ", ".join(sorted(policy.fsProfiles)) or "none"
        fix = f"define it or omit fsProfile to use {UNRESTRICTED_FS_PROFILE!r}"
        where, why = f"$.fsProfiles.{name}", f"no fs profile named {name!r} (defined: {known})"
        raise PolicyError([(where, f"{why}; {fix}")])
    read += [f"!{rule}" for rule in policy.denyRead]
    modify += [f"!{rule}" for rule in policy.denyModify]
    return EffectiveProfile(name=name, read=tuple(read), modify=tuple(modify))


def _normal(path: str, what: str) -> None:
    if not path.startswith("/") or "\x00" in path or os.path.normpath(path) != path:
        raise ValueError(f"{what} {path!r} must be an absolute, normalized path")


def _resolve(body: str, base: str) -> str:
    """The absolute pattern ``body`` (no leading '!') names for working area ``base``."""
    relative, rest = _split(body)
    root = base if relative else "/"
    return root if not rest else f"{root.rstrip('/')}/{rest}"


@functools.lru_cache(maxsize=1024)
def _segments(pattern: str) -> tuple[str, ...]:
    """The pattern's segments; a run of '**' segments is one, a run of '*' inside one is one."""
    out: list[str] = []
    for segment in pattern.split("/")[1:] if pattern != "/" else []:
        if segment != "**":
            out.append(re.sub(r"\*+", "*", segment))
        elif out[-1:] != ["**"]:
            out.append(segment)
    return tuple(out)


def _at(chunk: str, text: str, i: int) -> bool:
    """Whether ``chunk`` ('?' is any one character, no '*') matches ``text`` at ``i``."""
    if "?" not in chunk:
        return text.startswith(chunk, i)
    piece = text[i : i + len(chunk)]
    if len(piece) != len(chunk):
        return False
    return all(c in ("?", d) for c, d in zip(chunk, piece, strict=True))


@functools.lru_cache(maxsize=1024)
def _finder(chunk: str) -> re.Pattern[str]:
    return re.compile("".join("." if c == "?" else re.escape(c) for c in chunk), re.DOTALL)


def _glob(pattern: str, text: str) -> bool:
    """One segment: '*' is any run of characters, '?' is one. The pieces between stars
    are placed leftmost-first, which is optimal, so there is no backtracking at all: a
    regex here took exponential time on rules like '*a*a*a*a*a*b' against a long name."""
    if "*" not in pattern:
        return len(pattern) == len(text) and _at(pattern, text, 0)
    first, *middle, last = pattern.split("*")
    pos, end = len(first), len(text) - len(last)
    if end < pos or not (_at(first, text, 0) and _at(last, text, end)):
        return False
    for chunk in filter(None, middle):
        if "?" in chunk:
            found = _finder(chunk).search(text, pos, end)
            start = found.start() if found else -1
        else:
            start = text.find(chunk, pos, end)
        if start < 0:
            return False
        pos = start + len(chunk)
    return True


def _matches(pattern: str, path: str) -> bool:
    """Whether the absolute ``pattern`` names ``path``; '**' is zero or more whole segments.

    Walks the pattern once, keeping every path position reachable so far as one bit of
    an int: a literal segment is one mask, a wildcard one a glob per reachable part."""
    parts = path.split("/")[1:] if path != "/" else []
    at: dict[str, int] = {}  # part -> bits of the positions just after it
    for i, part in enumerate(parts):
        at[part] = at.get(part, 0) | 1 << (i + 1)
    reach = 1  # bit i set: the first i parts are matched
    for segment in _segments(pattern):
        if segment == "**":
            reach = ((1 << (len(parts) + 1)) - 1) & ~((reach & -reach) - 1)
        elif "*" not in segment and "?" not in segment:
            reach = (reach << 1) & at.get(segment, 0)
        else:
            bits, reach = reach, 0
            while bits:
                i = (bits & -bits).bit_length() - 1
                bits &= bits - 1
                if i < len(parts) and _glob(segment, parts[i]):
                    reach |= 1 << (i + 1)
        if not reach:
            return False
    return bool(reach >> len(parts) & 1)


def check_path(rules: Sequence[str], path: str, *, base: str) -> bool:
    """Whether ``rules`` allow ``path``: walked in order, the last match wins, default deny."""
    _normal(path, "path")
    _normal(base, "base")
    allowed = False
    for rule in rules:
        negated = rule.startswith("!")
        if _matches(_resolve(rule.removeprefix("!"), base), path):
            allowed = not negated
    return allowed


# --- kernel plan ----------------------------------------------------------------------


@dataclass(frozen=True)
class ReadPlan:
    """What Landlock (grants: whole trees or single files) and masking enforce, and what not."""

    grants: tuple[str, ...]
    masks: tuple[str, ...]
    gaps: tuple[str, ...]

    @property
    def unenforced(self) -> tuple[str, ...]:
        """The gaps where the kernel would allow what the policy denies (fail-open)."""
        return tuple(g for g in self.gaps if UNENFORCED in g)

    def describe(self) -> str:
        """One line per grant, mask and gap, for logs and reports."""
        rows = [("grant", self.grants), ("mask ", self.masks), ("gap  ", self.gaps)]
        return "\n".join(["read plan:"] + [f"  {k} {v}" for k, vs in rows for v in vs])


@dataclass(frozen=True)
class _Gap:
    text: str
    scope: str  # lapses when a later tree grant re-allows everything under this path
    grant: str | None = None  # lapses when this grant is revoked


def _under(path: str, tree: str) -> bool:
    return path == tree or tree == "/" or path.startswith(tree + "/")


def _shape(pattern: str) -> tuple[str, str]:
    """("literal" | "tree" | "wild", the literal path before the first wildcard segment)."""
    segments = pattern.split("/")[1:] if pattern != "/" else []
    wild = [i for i, s in enumerate(segments) if "*" in s or "?" in s]
    if not wild:
        return "literal", pattern
    literal = "/" + "/".join(segments[: wild[0]])
    if wild == [len(segments) - 1] and segments[-1] == "**":
        return "tree", literal
    return "wild", literal


class _Planner:
    """Walks read rules in order, keeping what a later rule would change exact."""

    def __init__(self) -> None:
        self.grants: dict[str, bool] = {}  # path -> the whole tree beneath it (else one path)
        self.masks: dict[str, bool] = {}  # path -> from a tree rule (else a literal one)
        self.gaps: list[_Gap] = []

    def in_tree(self, path: str) -> bool:
        return any(tree and _under(path, g) for g, tree in self.grants.items())

    def allow(self, rule: str, kind: str, lit: str) -> None:
        for mask, tree in list(self.masks.items()):  # re-allowed whole: the mask goes
            if _under(mask, lit) and (kind == "tree" or (mask == lit and not tree)):
                del self.masks[mask]
        hidden = [m for m in self.masks if _under(lit, m) or (kind == "wild" and _under(m, lit))]
        for mask in sorted(hidden):
            why = f"re-allows paths inside masked {mask!r}: the mask wins (stricter than policy)"
            self.gaps.append(_Gap(f"read rule {rule!r} {why}", scope=lit))
        if kind == "wild" and not self.in_tree(lit):
            why = "has wildcards Landlock cannot grant (only a literal path or a whole tree)"
            self.gaps.append(_Gap(f"read rule {rule!r} {why}: paths it names stay unreadable", lit))
        if kind == "wild" or hidden:
            return
        if kind == "tree":  # everything under lit is allowed again: earlier gaps there lapse
            self.gaps = [g for g in self.gaps if not _under(g.scope, lit)]
        self.grants[lit] = self.grants.get(lit, False) or kind == "tree"

    def deny(self, body: str, pattern: str, kind: str, lit: str) -> None:
        if kind != "wild":
            for g, tree in list(self.grants.items()):
                if (g == lit and not tree) or (kind == "tree" and _under(g, lit)):
                    del self.grants[g]
            if self.in_tree(lit):
                self.masks[lit] = self.masks.get(lit, False) or kind == "tree"
            return
        prefix = pattern.removesuffix("/**") if pattern.endswith("/**") else None
        for g, tree in list(self.grants.items()):
            ancestors = [g] + [g[:i] or "/" for i in range(len(g)) if g[i] == "/"]
            if (not tree and _matches(pattern, g)) or (
                tree and prefix is not None and any(_matches(prefix or "/", a) for a in ancestors)
            ):
                del self.grants[g]  # the rule denies all of this grant: revoke it, exactly
            elif tree and (_under(g, lit) or _under(lit, g)):
                why = f"not enforceable by Landlock or masking; {UNENFORCED}"
                text = f"deny rule {body!r} matches by pattern inside granted tree {g!r}: {why}"
                self.gaps.append(_Gap(text, scope=lit, grant=g))

    def plan(self) -> ReadPlan:
        trees = [g for g, tree in self.grants.items() if tree]
        grants = sorted(g for g in self.grants if not any(t != g and _under(g, t) for t in trees))
        gaps = [g.text for g in self.gaps if g.grant is None or g.grant in self.grants]
        for path in grants:
            if not self.grants[path] and os.path.isdir(path):
                why = "Landlock grants its whole tree, more than the rule allows"
                gaps.append(f"read rule {path!r} names a directory: {why}")
        masks = sorted(m for m in self.masks if self.in_tree(m))
        masks = [m for m in masks if not any(o != m and _under(m, o) for o in masks)]
        for path in masks:
            if not self.masks[path] and os.path.isdir(path):
                why = "masking hides its contents too (stricter than the policy)"
                gaps.append(f"deny rule {path!r} names a directory: {why}")
        return ReadPlan(grants=tuple(grants), masks=tuple(masks), gaps=tuple(dict.fromkeys(gaps)))


def compile_read(profile: EffectiveProfile, *, base: str) -> ReadPlan:
    """Turn the ordered read rules into Landlock grants, mount masks, and reported gaps."""
    _normal(base, "base")
    planner = _Planner()
    for rule in profile.read:
        body = rule.removeprefix("!")
        pattern = _resolve(body, base)
        kind, lit = _shape(pattern)
        if rule.startswith("!"):
            planner.deny(body, pattern, kind, lit)
        else:
            planner.allow(rule, kind, lit)
    return planner.plan()
