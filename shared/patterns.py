"""Operator regular expressions, matched in time linear in the text, never backtracking.

Every pattern an operator writes — a ``parameters_schema``'s ``pattern`` and
``patternProperties``, ``fs_write.path_pattern`` — is matched against text a caller
or an action chooses. Python's ``re`` backtracks: ``^(a+)+$`` against 28 ``a`` and a
``b`` froze core's loop for seconds. Here a pattern is parsed with Python's own
parser, compiled to a Thompson NFA, and run as a lazily built DFA (the subset of NFA
states reached so far, one cached step per character): the work is proportional to
the text times the pattern's size, whatever the pattern.

The syntax is RE2's (which is ECMA-262's, less lookaround): no lookahead or
lookbehind, no backreferences, no atomic groups or possessive repeats, no inline
flags. ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII, and ``$`` matches only at the end of
the text (not before a final newline, as Python's does). A pattern outside that, or
that would compile to more than ``MAX_STATES`` states (``x{1000}`` repeats ``x`` a
thousand times), is a :class:`PatternError` — at catalog load, with the reason.
"""

from __future__ import annotations

import functools
import re
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any, Literal

MAX_STATES = 2_000
_CACHE_ENTRIES = 8192  # DFA steps kept per pattern; past it the cache starts over
_ASCII_DIGITS = frozenset("0123456789")
_ASCII_SPACE = frozenset("\t\n\f\r ")
_ASCII_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_UNSUPPORTED = {
    "ASSERT": "lookahead/lookbehind",
    "ASSERT_NOT": "negative lookahead/lookbehind",
    "GROUPREF": "a backreference",
    "GROUPREF_EXISTS": "a conditional group",
    "ATOMIC_GROUP": "an atomic group",
    "POSSESSIVE_REPEAT": "a possessive repeat",
}
_CHAR, _SPLIT, _ASSERT, _MATCH = range(4)
# A character class: (negated, single chars, ranges (lo, hi) as code points, categories).
Class = tuple[bool, frozenset[str], tuple[tuple[int, int], ...], tuple[str, ...]]
_ANY: Class = (True, frozenset("\n"), (), ())
_Trans = dict[tuple[frozenset[int], str], tuple[frozenset[int], frozenset[int]]]


class PatternError(ValueError):
    """A pattern this engine does not take; the message says why."""


def _category(cat: str, c: str) -> bool:
    if cat == "CATEGORY_DIGIT":
        return c in _ASCII_DIGITS
    if cat == "CATEGORY_NOT_DIGIT":
        return c not in _ASCII_DIGITS
    if cat == "CATEGORY_WORD":
        return c in _ASCII_WORD
    if cat == "CATEGORY_NOT_WORD":
        return c not in _ASCII_WORD
    if cat == "CATEGORY_SPACE":
        return c in _ASCII_SPACE
    return c not in _ASCII_SPACE  # CATEGORY_NOT_SPACE


def _in_class(cls: Class, c: str) -> bool:
    negated, chars, ranges, cats = cls
    o = ord(c)
    hit = (
        c in chars or any(lo <= o <= hi for lo, hi in ranges) or any(_category(k, c) for k in cats)
    )
    return hit != negated


class _Builder:
    """Compiles the parsed pattern backwards: each piece knows the state that follows it."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.arg: list[Any] = []
        self.outs: list[list[int]] = []

    def state(self, kind: int, arg: Any, outs: list[int]) -> int:
        if len(self.kind) >= MAX_STATES:
            raise PatternError(
                f"compiles to more than {MAX_STATES} states: simplify its repeats "
                "(bound a length with maxLength, not x{1,N})"
            )
        self.kind.append(kind)
        self.arg.append(arg)
        self.outs.append(outs)
        return len(self.kind) - 1

    def seq(self, items: Any, nxt: int) -> int:
        for op, av in reversed(list(items)):
            nxt = self.item(str(op), av, nxt)
        return nxt

    def item(self, op: str, av: Any, nxt: int) -> int:
        if op in _UNSUPPORTED:
            raise PatternError(f"uses {_UNSUPPORTED[op]}, which a linear-time matcher cannot run")
        if op == "LITERAL":
            return self.state(_CHAR, (False, frozenset(chr(av)), (), ()), [nxt])
        if op == "NOT_LITERAL":
            return self.state(_CHAR, (True, frozenset(chr(av)), (), ()), [nxt])
        if op == "ANY":
            return self.state(_CHAR, _ANY, [nxt])
        if op == "IN":
            return self.state(_CHAR, self.char_class(av), [nxt])
        if op == "AT":
            return self.state(_ASSERT, str(av), [nxt])
        if op == "BRANCH":
            return self.state(_SPLIT, None, [self.seq(alt, nxt) for alt in av[1]])
        if op == "SUBPATTERN":
            _group, add_flags, del_flags, inner = av
            if add_flags or del_flags:
                raise PatternError("uses inline flags, which are not supported")
            return self.seq(inner, nxt)
        if op in ("MAX_REPEAT", "MIN_REPEAT"):
            return self.repeat(av, nxt)
        raise PatternError(f"uses {op.lower()}, which is not supported")

    def repeat(self, av: Any, nxt: int) -> int:
        low, high, inner = av
        if high == sre.MAXREPEAT:
            loop = self.state(_SPLIT, None, [])
            self.outs[loop] += [self.seq(inner, loop), nxt]
            cur = loop
        else:
            cur = nxt
            for _ in range(high - low):
                cur = self.state(_SPLIT, None, [self.seq(inner, cur), nxt])
        for _ in range(low):
            cur = self.seq(inner, cur)
        return cur

    def char_class(self, items: Any) -> Class:
        negated, chars, ranges, cats = False, set(), [], []
        for op, av in items:
            name = str(op)
            if name == "NEGATE":
                negated = True
            elif name == "LITERAL":
                chars.add(chr(av))
            elif name == "RANGE":
                ranges.append((int(av[0]), int(av[1])))
            elif name == "CATEGORY":
                cats.append(str(av))
            else:
                raise PatternError(f"uses {name.lower()} in a character class")
        return negated, frozenset(chars), tuple(ranges), tuple(cats)


class Pattern:
    """A compiled operator pattern: :meth:`search` (JSON Schema's ``pattern``) and
    :meth:`fullmatch` (``path_pattern``), each a yes or no."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        try:
            parsed = sre_parse.parse(pattern, 0)
        except re.error as exc:
            raise PatternError(f"not a valid regular expression: {exc}") from None
        except RecursionError:
            raise PatternError("nested too deeply") from None
        if parsed.state.flags & ~(sre.SRE_FLAG_UNICODE):
            raise PatternError("uses inline flags, which are not supported")
        b = _Builder()
        try:
            self._match = b.state(_MATCH, None, [])
            self._start = b.seq(parsed, self._match)
        except RecursionError:
            raise PatternError("nested too deeply") from None
        self._kind, self._arg, self._outs = b.kind, b.arg, b.outs
        self._boundary = any(a in ("AT_BOUNDARY", "AT_NON_BOUNDARY") for a in b.arg)
        self._closures: dict[tuple[frozenset[int], int], frozenset[int]] = {}
        self._steps: dict[tuple[frozenset[int], str], frozenset[int]] = {}
        # The DFA proper, per mode (anchored or not): (closed set, char) -> (next raw
        # set, its closure in mid-text), for patterns whose assertions only look at
        # the ends of the text.
        self._dfa: tuple[_Trans, _Trans] = ({}, {})

    def __repr__(self) -> str:
        return f"<Pattern {self.pattern!r} states={len(self._kind)}>"

    def _holds(self, at: str, ctx: int) -> bool:
        start, end, prev_word, next_word = ctx & 1, ctx & 2, ctx & 4, ctx & 8
        if at in ("AT_BEGINNING", "AT_BEGINNING_STRING"):
            return bool(start)
        if at in ("AT_END", "AT_END_STRING"):
            return bool(end)
        if at == "AT_BOUNDARY":
            return bool(prev_word) != bool(next_word)
        if at == "AT_NON_BOUNDARY":
            return bool(prev_word) == bool(next_word)
        return False  # MULTILINE anchors cannot be written without flags

    def _closure(self, states: frozenset[int], ctx: int) -> frozenset[int]:
        key = (states, ctx)
        found = self._closures.get(key)
        if found is not None:
            return found
        seen: set[int] = set()
        stack = list(states)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            kind = self._kind[s]
            if kind == _SPLIT or (kind == _ASSERT and self._holds(self._arg[s], ctx)):
                stack += self._outs[s]
        # Only what consumes a character or accepts matters from here on.
        result = frozenset(s for s in seen if self._kind[s] in (_CHAR, _MATCH))
        self._remember(self._closures, key, result)
        return result

    def _step(self, states: frozenset[int], c: str) -> frozenset[int]:
        key = (states, c)
        found = self._steps.get(key)
        if found is not None:
            return found
        result = frozenset(
            self._outs[s][0]
            for s in states
            if self._kind[s] == _CHAR and _in_class(self._arg[s], c)
        )
        self._remember(self._steps, key, result)
        return result

    @staticmethod
    def _remember(cache: dict[Any, frozenset[int]], key: Any, value: frozenset[int]) -> None:
        if len(cache) >= _CACHE_ENTRIES:
            cache.clear()
        cache[key] = value

    def _run(self, text: str, *, anchored: bool) -> bool:
        if self._boundary:
            return self._run_boundaries(text, anchored=anchored)
        n, start = len(text), frozenset((self._start,))
        closed = self._closure(start, 1 | (2 if n == 0 else 0))
        if n == 0 or (not anchored and self._match in closed):
            return self._match in closed
        dfa = self._dfa[anchored]
        raw = start
        for c in text:
            hit = dfa.get((closed, c))
            if hit is None:
                raw = self._step(closed, c) if anchored else self._step(closed, c) | start
                hit = (raw, self._closure(raw, 0))
                if len(dfa) >= _CACHE_ENTRIES:
                    dfa.clear()
                dfa[(closed, c)] = hit
            raw, closed = hit
            if anchored and not raw:
                return False
            if not anchored and self._match in closed:
                return True
        return self._match in self._closure(raw, 2)  # at the end: $ holds

    def _run_boundaries(self, text: str, *, anchored: bool) -> bool:
        """The general walk, for ``\\b``/``\\B``: their truth needs the next character."""
        n, start = len(text), frozenset((self._start,))
        current = start
        for i in range(n + 1):
            prev_word = i > 0 and text[i - 1] in _ASCII_WORD
            next_word = i < n and text[i] in _ASCII_WORD
            ctx = (i == 0) | (i == n) << 1 | prev_word << 2 | next_word << 3
            closed = self._closure(current, ctx)
            if self._match in closed and (not anchored or i == n):
                return True
            if i == n or (anchored and not closed):
                return False
            current = self._step(closed, text[i])
            if not anchored:
                current = current | start
        return False

    # True or None, as ``re`` answers "a match or None" (no groups are kept).
    def search(self, text: str) -> Literal[True] | None:
        """Does the pattern match anywhere in ``text``?"""
        return True if self._run(text, anchored=False) else None

    def fullmatch(self, text: str) -> Literal[True] | None:
        """Does the pattern match the whole of ``text``?"""
        return True if self._run(text, anchored=True) else None


@functools.lru_cache(maxsize=1024)
def compile(pattern: str) -> Pattern:  # the name re's users expect
    """The compiled pattern (cached), or :class:`PatternError` saying why not."""
    return Pattern(pattern)


def problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be an operator pattern, or None."""
    try:
        compile(pattern)
    except PatternError as exc:
        return str(exc)
    return None
