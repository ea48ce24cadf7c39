"""A ``parameters_schema`` validator whose every regular expression is linear-time.

jsonschema matches ``pattern``, ``patternProperties`` and (through them)
``additionalProperties`` with Python's backtracking ``re``; here those keywords use
:mod:`sensorium.shared.patterns` instead. :func:`pattern_problems` is the catalog's
lint: every pattern in a schema must compile there, and ``unevaluatedProperties``
beside ``patternProperties`` (which jsonschema evaluates with ``re`` internally) is
refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError

from sensorium.shared import patterns


def _pattern(
    validator: Any, patrn: str, instance: Any, _schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not patterns.compile(patrn).search(instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(
    validator: Any, pattern_properties: dict[str, Any], instance: Any, _schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in pattern_properties.items():
        compiled = patterns.compile(patrn)
        for k, v in instance.items():
            if compiled.search(k):
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    compiled = [patterns.compile(p) for p in schema.get("patternProperties", {})]
    extras = [k for k in instance if k not in properties and not any(c.search(k) for c in compiled)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        shown = ", ".join(repr(e) for e in sorted(extras, key=str))
        if compiled:
            regexes = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            yield ValidationError(f"{shown} do not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({shown} {verb} unexpected)"
            )


LinearValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


def parameters_validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """Draft 2020-12 with formats enforced, every operator pattern linear-time."""
    validator: jsonschema.protocols.Validator = LinearValidator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    return validator


_DATA = ("const", "enum", "default", "examples")  # values, not schemas


def _walk(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    stack: list[tuple[Any, str]] = [(node, where)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            yield where, node
            stack += [(v, f"{where}.{k}") for k, v in node.items() if k not in _DATA]
        elif isinstance(node, list):
            stack += [(v, f"{where}[{i}]") for i, v in enumerate(node)]


def pattern_problems(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, why) for each pattern the linear-time matcher refuses; ``where`` is
    relative to the schema (``.properties.path.pattern``)."""
    found: list[tuple[str, str]] = []
    has_pattern_properties, unevaluated = False, []
    for where, node in _walk(schema, ""):
        if "unevaluatedProperties" in node:
            unevaluated.append(f"{where}.unevaluatedProperties")
        patrn = node.get("pattern")
        if isinstance(patrn, str) and (why := patterns.problem(patrn)) is not None:
            found.append((f"{where}.pattern", why))
        props = node.get("patternProperties")
        if isinstance(props, dict):
            has_pattern_properties = True
            for p in props:
                if (why := patterns.problem(p)) is not None:
                    found.append((f"{where}.patternProperties", f"{p[:100]!r} {why}"))
    if has_pattern_properties:
        # jsonschema evaluates patternProperties for unevaluatedProperties with ``re``.
        why = "cannot be used with patternProperties; use additionalProperties"
        found += [(where, why) for where in unevaluated]
    return sorted(found)
