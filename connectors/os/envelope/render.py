"""Filling an argv template with one directive's parameters (DESIGN §4).

One output element per template element, always: a ``{{name}}`` placeholder fills
text inside its element and never splits or joins elements. What a template may
say is checked when the catalog loads (``argv.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from sensorium.shared.canonical import canonical_json

PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")
# Linux refuses (E2BIG) any one argv string over MAX_ARG_STRLEN, 32 pages with its NUL, and
# the whole argv travels to the spawn zygote in one message: the rendered argv, every
# element's UTF-8 bytes and NUL together, is capped at that size.
ARGV_MAX_BYTES = 32 * 4096


class RenderError(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def _text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RenderError(
                name, f"parameter {name!r} is {value!r}; only finite numbers fill an argv element"
            )
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str | int):
        return str(value)
    raise RenderError(name, f"parameter {name!r} is not a scalar and cannot fill an argv element")


def _value(name: str, params: Mapping[str, Any], connector_values: Mapping[str, str]) -> str:
    if name == "params_json":
        try:
            return canonical_json(dict(params)).decode()
        except (ValueError, TypeError) as exc:
            raise RenderError("", f"parameters have no canonical JSON form: {exc}") from None
        except RecursionError:
            raise RenderError("", "parameters are nested too deeply for JSON") from None
    if name in connector_values:
        return connector_values[name]
    if name not in params:
        raise RenderError(name, f"parameter {name!r} is required by the argv template")
    return _text(name, params[name])


def _refuse_option(
    element: str, params: Mapping[str, Any], connector_values: Mapping[str, str]
) -> None:
    """A caller string that starts an element with '-' would be read as an option."""
    pos = 0
    while (m := PLACEHOLDER.match(element, pos)) is not None:
        name = m.group(1)
        if name == "params_json" or name in connector_values:
            return
        value = params.get(name)
        if isinstance(value, str) and value.startswith("-"):
            raise RenderError(
                name,
                f"parameter {name!r} starts with '-' and would be read as an option; "
                "the template needs '--' before it or the schema must forbid a leading '-'",
            )
        if _text(name, value):
            return  # the element's first character is this value's, and it is not '-'
        pos = m.end()


def render(
    argv_shape: list[str], params: Mapping[str, Any], connector_values: Mapping[str, str]
) -> list[str]:
    """The concrete argv: one output element per template element, always."""
    out: list[str] = []
    options_end = False
    values: dict[str, str] = {}
    spent = 0  # characters filled in so far: never more bytes, so it stops a blow-up early

    def fill(m: re.Match[str]) -> str:
        nonlocal spent
        name = m.group(1)
        if name not in values:
            values[name] = _value(name, params, connector_values)
        spent += len(values[name])
        if spent > ARGV_MAX_BYTES:
            raise _too_long(name, spent)
        return values[name]

    size = 0
    for element in argv_shape:
        rendered = PLACEHOLDER.sub(fill, element)
        if "\0" in rendered:
            raise RenderError("", "argv elements cannot contain NUL bytes")
        try:
            size += len(rendered.encode()) + 1
        except UnicodeEncodeError:
            raise RenderError("", "argv elements must be text that UTF-8 can encode") from None
        if size > ARGV_MAX_BYTES:
            raise _too_long("", size)
        if not options_end:
            _refuse_option(element, params, connector_values)
        out.append(rendered)
        options_end = options_end or element == "--"
    return out


def _too_long(name: str, size: int) -> RenderError:
    what = f"parameter {name!r} makes the argv" if name else "the rendered argv is"
    return RenderError(
        name,
        f"{what} over {ARGV_MAX_BYTES} bytes (at least {size}), more than one command "
        "line holds; send smaller parameters",
    )
