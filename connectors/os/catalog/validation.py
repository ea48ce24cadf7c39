"""A declaration checked against every catalog rule: the published schema first, then
what the schema cannot say (parameter schemas, timeouts, argv, class blocks).

:class:`Problem` is one failure; ``sources.py`` gathers them over every source.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jsonschema
import msgspec
import referencing
import referencing.exceptions
from referencing.jsonschema import DRAFT202012

from sensorium.connectors.os.catalog.interpreters import InterpreterPin, is_env, resolve
from sensorium.connectors.os.catalog.signing import signing_problems
from sensorium.connectors.os.envelope.argv import check_template
from sensorium.connectors.os.envelope.classes import check_class
from sensorium.shared.diagnostics import OsErrorCode
from sensorium.shared.schemapatterns import pattern_problems
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.fs_policy import FsPolicy


@dataclass(frozen=True)
class Problem:
    """One validation failure: which source, which declaration, which field, which rule."""

    source: str
    action_id: str | None
    field: str
    message: str
    # The stable code a report carries for it; None: ``catalog-invalid``.
    code: str | None = None

    def __str__(self) -> str:
        where = f"{self.source}"
        if self.action_id:
            where += f" [{self.action_id}]"
        return f"{where} {self.field}: {self.message}"


@functools.cache
def _declaration_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(
        resources.files("sensorium.schemas")
        .joinpath("sensorium-action-declaration.v1.schema.json")
        .read_text()
    )
    return jsonschema.Draft202012Validator(schema)


@functools.lru_cache(maxsize=4096)
def _schema_problem(schema_json: str) -> str | None:
    """Metaschema validation, once per distinct schema (catalogs repeat theirs a lot)."""
    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(schema_json))
    except jsonschema.SchemaError as exc:
        return exc.message
    except RecursionError:
        return "nested too deeply"
    return None


# Keywords whose values are subschemas (JSON Schema 2020-12, plus the older spellings).
_SUBSCHEMA = (
    *("items", "additionalItems", "additionalProperties", "unevaluatedItems"),
    *("unevaluatedProperties", "contains", "propertyNames", "if", "then", "else", "not"),
)
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _ref_problem(schema: dict[str, Any]) -> str | None:
    """A ``$ref`` that core could not resolve: it never fetches, so validating a directive
    against it would fail every time, long after the catalog was signed."""
    refs: list[str] = []
    nested_id = False
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        nested_id = nested_id or (node is not schema and "$id" in node)
        if isinstance(node.get("$ref"), str):
            refs.append(node["$ref"])
        stack += [node.get(k) for k in _SUBSCHEMA]
        for k in _SUBSCHEMA_LISTS:
            stack += node[k] if isinstance(node.get(k), list) else []
        for k in _SUBSCHEMA_MAPS:
            stack += node[k].values() if isinstance(node.get(k), dict) else []
    if nested_id:  # a nested $id moves the base of the refs inside it: leave those be
        return None
    resolver = referencing.Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    for ref in refs:
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            return f"$ref {ref[:200]!r} does not resolve within the schema; core never fetches one"
    return None


def _where(err: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
    return path.lstrip(".") or "$"


def executable_gap(decl: Declaration) -> str | None:
    """Why the declared program cannot be run on this node, or None: the binary (or the
    script's interpreter) must be an executable file, and a script a file."""
    exe = decl.executable
    path = exe.interpreter or exe.path
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        found = shutil.which(os.path.basename(path))
        hint = f" (found {found}; point the declaration there)" if found else ""
        return f"{path} is missing or not executable on this node{hint}"
    if exe.kind == "script" and not os.path.isfile(exe.path):
        return f"the script {exe.path} is missing on this node"
    return None


def validate_declaration(
    entry: dict[str, Any],
    source: str,
    problems: list[Problem],
    policy: FsPolicy | None = None,
    *,
    connector_id: str = "sensorium-os",
    pins: dict[str, InterpreterPin] | None = None,
) -> Declaration | None:
    """The declaration as it will run, or None (its problems appended).

    ``connector_id``: the connector loading it (a declaration naming another is refused).
    ``pins``: where an ``env NAME`` interpreter's resolution is recorded; the returned
    declaration then names the resolved program as its interpreter."""
    aid = entry.get("action_id") if isinstance(entry.get("action_id"), str) else None
    # The published schema first: it names every structural problem, not only the first.
    try:
        errors = sorted(
            _declaration_validator().iter_errors(entry), key=lambda e: list(map(str, e.path))
        )
    except RecursionError:
        problems.append(Problem(source, aid, "$", "nested too deeply to be a declaration"))
        return None
    for err in errors:
        problems.append(Problem(source, aid, _where(err), err.message))
    if errors:
        return None
    try:
        decl = msgspec.convert(entry, type=Declaration)
    except msgspec.ValidationError as exc:
        problems.append(Problem(source, aid, "$", str(exc)))
        return None
    before = len(problems)

    def bad(field_path: str, message: str, code: str | None = None) -> None:
        problems.append(Problem(source, decl.action_id, field_path, message, code))

    if decl.connector_id != connector_id:
        bad(
            "connector_id",
            f"declares connector {decl.connector_id!r}, but it is loaded by {connector_id!r}",
        )
    if decl.class_ == "operator-gated-spawn":
        bad("class", "operator-gated-spawn is reserved and cannot be declared yet")
    schema_problem = _schema_problem(json.dumps(decl.parameters_schema, sort_keys=True))
    if schema_problem is not None:
        bad(
            "parameters_schema",
            f"not a valid JSON Schema: {schema_problem}",
            OsErrorCode.PARAMETERS_SCHEMA_INVALID,
        )
    else:
        if decl.parameters_schema.get("type") != "object":
            bad("parameters_schema.type", 'must be "object": parameters are named')
        if (ref_problem := _ref_problem(decl.parameters_schema)) is not None:
            bad("parameters_schema", ref_problem)
        for where, why in pattern_problems(decl.parameters_schema):
            bad(f"parameters_schema{where}", why)
    if decl.default_timeout_ms > decl.max_timeout_ms:
        bad(
            "default_timeout_ms",
            f"{decl.default_timeout_ms} exceeds max_timeout_ms {decl.max_timeout_ms}",
        )
    if decl.executable.kind == "script" and decl.script is None:
        bad("script", "a script executable needs script.allowed_roots")
    if decl.executable.interpreter and decl.executable.kind != "script":
        bad("executable.interpreter", "only scripts name an interpreter")
    env_failed = False
    pin: InterpreterPin | str | None = None
    if decl.executable.kind == "script" and is_env(decl.executable.interpreter):
        assert decl.executable.interpreter is not None
        pin = resolve(decl.executable.interpreter, decl.executable.argv_shape[0])
        if isinstance(pin, str):
            bad("executable.interpreter", pin)
            env_failed = True  # said once: not again as "env is a launcher"
        else:
            # From here on the declaration runs what env would have found, directly.
            exe = msgspec.structs.replace(decl.executable, interpreter=pin.path)
            decl = msgspec.structs.replace(decl, executable=exe)
    for field_path, message in check_template(decl):
        if not (env_failed and field_path == "executable.interpreter"):
            bad(field_path, message)
    _check_class_blocks(decl, bad)
    for field_path, message in signing_problems(decl):
        bad(field_path, message)
    for field_path, message in check_class(decl, policy):
        bad(field_path, message)
    if len(problems) == before and (gap := executable_gap(decl)) is not None:
        # Seed 048: "executable path resolvable" is a load-time rule — the whole catalog
        # is refused, not left with this action missing.
        bad("executable.path", gap)
    if len(problems) != before:
        return None
    if pins is not None and isinstance(pin, InterpreterPin):
        pins[decl.action_id] = pin
    return decl


_CLASS_BLOCKS = {
    "allowlisted-script": ("script",),
    "scoped-fs-write": ("fs_write",),
    "egress-network-spawn": ("egress_network",),
    "artifact-producing-spawn": ("artifact",),
    "composed-spawn": ("composed",),
}
_EFFECT_BLOCKS = {
    "scoped-fs-write": "fs_write",
    "egress-network": "egress_network",
    "artifact-produce": "artifact",
}


def _check_class_blocks(decl: Declaration, bad: Callable[[str, str], None]) -> None:
    for block in _CLASS_BLOCKS.get(decl.class_, ()):
        if getattr(decl, block) is None:
            bad(block, f"class {decl.class_} requires a {block} block")
    if decl.class_ == "composed-spawn" and decl.composed is not None:
        for effect in decl.composed.effects:
            needed = _EFFECT_BLOCKS.get(effect)
            if needed and getattr(decl, needed) is None:
                bad(needed, f"composed effect {effect} requires a {needed} block")
