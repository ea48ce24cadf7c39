"""Every code the client can raise by name, and every code any process emits, is a code
of a published vocabulary; the wire protocol guide says which layer emits which."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from sensorium.client import errors
from sensorium.shared.diagnostics import ALL_CODES, OsErrorCode, RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire import directive  # noqa: F401 - its CodedError subclass


def test_the_client_names_no_code_outside_the_vocabularies() -> None:
    assert set(errors._BY_CODE) <= ALL_CODES


def test_the_two_vocabularies_do_not_overlap() -> None:
    assert not {c.value for c in OsErrorCode} & {c.value for c in RuntimeErrorCode}


# --- what every process emits (issue 24, item 8) -----------------------------------------

REPO = Path(__file__).resolve().parents[2]


def _coded_classes() -> set[str]:
    """CodedError and every subclass whose first argument is the code."""
    found: set[str] = set()
    todo: list[type[CodedError]] = [CodedError]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if next(iter(inspect.signature(cls).parameters), None) == "code":
            found.add(cls.__name__)
    return found


# Calls whose code argument (``code=`` or the first positional) reaches a caller.
CODE_CALLS = {"Diagnostic", "WireError", *_coded_classes()}
VOCABULARIES = {"OsErrorCode", "RuntimeErrorCode"}


def _sources() -> list[Path]:
    skip = {"tests", "build", "bench", ".venv"}
    return [
        p
        for p in REPO.rglob("*.py")
        if not skip & set(p.relative_to(REPO).parts) and not p.name.startswith(".")
    ]


def _code_argument(call: ast.Call) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == "code":
            return kw.value
    return call.args[0] if call.args else None


def _called(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def test_no_process_emits_a_code_outside_the_vocabularies() -> None:
    """A code is a member of one of the two vocabularies, or passed through from one
    that was (``exc.code``, a stored ``error_code``); never a literal of its own."""
    bad: list[str] = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.Call) or _called(node) not in CODE_CALLS:
                continue
            arg = _code_argument(node)
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
                if arg.value.id in VOCABULARIES:
                    vocabulary = OsErrorCode if arg.value.id == "OsErrorCode" else RuntimeErrorCode
                    if arg.attr not in vocabulary.__members__:
                        bad.append(f"{where}: {arg.value.id}.{arg.attr}")
            elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if arg.value not in ALL_CODES:
                    bad.append(f"{where}: {arg.value!r}")
            elif isinstance(arg, ast.JoinedStr):
                bad.append(f"{where}: a code built at run time")
    assert not bad, bad
    assert len(_sources()) > 100  # the walk really saw the package


def test_the_wire_guide_says_who_emits_every_code() -> None:
    readme = (REPO / "docs" / "wire-protocol.md").read_text("utf-8")
    table = readme.split("| Layer | Codes |", 1)[1].split("\n\n", 1)[0]
    missing = sorted(c for c in ALL_CODES if f"`{c}`" not in table)
    assert not missing, missing
