"""Argv templates: load-time rules and rendering (DESIGN §4).

Each element is one string; a ``{{name}}`` placeholder fills text inside exactly
one element and never splits or joins elements. No conditionals, defaults,
command or environment expansion exist to be abused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sensorium.shared.canonical import canonical_json
from sensorium.shared.wire.declaration import Declaration

PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")
# Values the connector provides; which exist depends on the class's blocks.
CONNECTOR_VALUES = frozenset({"params_json", "scratch", "write_root", "artifact_dir"})
# Where /etc/shells is missing, these names still count as shells.
_FALLBACK_SHELLS = frozenset(
    {
        "sh",
        "bash",
        "dash",
        "zsh",
        "ksh",
        "mksh",
        "pdksh",
        "csh",
        "tcsh",
        "fish",
        "ash",
        "busybox",
        "rbash",
        "yash",
        "elvish",
        "nu",
        "xonsh",
    }
)
_SCALAR_TYPES = {"string", "integer", "number", "boolean"}
_COMMAND_FLAG = re.compile(r"^-[A-Za-z]*c[A-Za-z]*$")


def _system_shells() -> frozenset[str]:
    """Real paths of the shells the OS itself lists, plus their base names."""
    found: set[str] = set(_FALLBACK_SHELLS)
    try:
        lines = Path("/etc/shells").read_text().splitlines()
    except OSError:
        return frozenset(found)
    for line in lines:
        line = line.strip()
        if line.startswith("/"):
            found.add(os.path.basename(line))
            found.add(os.path.basename(os.path.realpath(line)))
    return frozenset(found)


def is_shell(path: str) -> bool:
    shells = _system_shells()
    return os.path.basename(path) in shells or os.path.basename(os.path.realpath(path)) in shells


def placeholders(element: str) -> list[str]:
    return PLACEHOLDER.findall(element)


def check_template(decl: Declaration) -> list[tuple[str, str]]:
    """Every argv-template problem as ``(field path, what is wrong)``; empty when clean."""
    problems: list[tuple[str, str]] = []
    exe = decl.executable
    props = decl.parameters_schema.get("properties", {})
    props = props if isinstance(props, dict) else {}
    available = {"params_json", "scratch"}
    if decl.fs_write is not None:
        available.add("write_root")
    if decl.artifact is not None:
        available.add("artifact_dir")

    if "{{" in exe.path or (exe.interpreter and "{{" in exe.interpreter):
        problems.append(
            (
                "executable.path",
                "the executable path is fixed by the operator; "
                "a caller-supplied executable path is not allowed",
            )
        )
    for field, prog in (("executable.path", exe.path), ("executable.interpreter", exe.interpreter)):
        if prog and is_shell(prog):
            problems.append(
                (
                    field,
                    f"{prog} is a shell; shell invocation is forbidden — name the program itself",
                )
            )
    # `env sh -c ...`, `nice bash -c ...`: whatever launches it, a shell followed by a
    # command-string flag is shell invocation.
    shape = exe.argv_shape
    for i in range(1, len(shape) - 1):
        flags = [x for x in shape[i + 1 :] if _COMMAND_FLAG.match(x)]
        if is_shell(shape[i]) and flags:
            problems.append(
                (
                    f"executable.argv_shape[{i}]",
                    f"{shape[i]!r} with {flags[0]!r} runs a shell command string; "
                    "shell invocation is forbidden",
                )
            )
    if exe.argv_shape and placeholders(exe.argv_shape[0]):
        problems.append(
            (
                "executable.argv_shape[0]",
                "argv[0] names the program and cannot come from a parameter",
            )
        )
    for i, element in enumerate(exe.argv_shape):
        stripped = PLACEHOLDER.sub("", element)
        if "{{" in stripped or "}}" in stripped:
            problems.append(
                (
                    f"executable.argv_shape[{i}]",
                    f"malformed placeholder in {element!r}; write {{{{name}}}}",
                )
            )
        for name in placeholders(element):
            if name in CONNECTOR_VALUES:
                if name not in available:
                    problems.append(
                        (
                            f"executable.argv_shape[{i}]",
                            f"{{{{{name}}}}} is not provided for class {decl.class_}",
                        )
                    )
                continue
            if name not in props:
                problems.append(
                    (
                        f"executable.argv_shape[{i}]",
                        f"placeholder {{{{{name}}}}} names no property of "
                        f"parameters_schema and no connector value "
                        f"({', '.join(sorted(CONNECTOR_VALUES))})",
                    )
                )
                continue
            ptype = props[name].get("type") if isinstance(props[name], dict) else None
            types = ptype if isinstance(ptype, list) else [ptype]
            if not types or not all(isinstance(t, str) and t in _SCALAR_TYPES for t in types):
                problems.append(
                    (
                        f"executable.argv_shape[{i}]",
                        f"parameter {name!r} must declare a scalar type "
                        f"({', '.join(sorted(_SCALAR_TYPES))}); structured values "
                        "travel only through {{params_json}}",
                    )
                )
    return problems


class RenderError(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def _text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise RenderError(name, f"parameter {name!r} is not a scalar and cannot fill an argv element")


def render(
    argv_shape: list[str], params: Mapping[str, Any], connector_values: Mapping[str, str]
) -> list[str]:
    """The concrete argv: one output element per template element, always."""
    out: list[str] = []
    for element in argv_shape:

        def fill(m: re.Match[str]) -> str:
            name = m.group(1)
            if name == "params_json":
                try:
                    return canonical_json(dict(params)).decode()
                except (ValueError, TypeError) as exc:
                    raise RenderError(
                        "", f"parameters have no canonical JSON form: {exc}"
                    ) from None
            if name in connector_values:
                return connector_values[name]
            if name not in params:
                raise RenderError(name, f"parameter {name!r} is required by the argv template")
            return _text(name, params[name])

        rendered = PLACEHOLDER.sub(fill, element)
        if "\0" in rendered:
            raise RenderError("", "argv elements cannot contain NUL bytes")
        out.append(rendered)
    return out
