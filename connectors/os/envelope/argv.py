"""Argv templates: the load-time rules (DESIGN §4); filling one is ``render.py``'s.

Each element is one string; a ``{{name}}`` placeholder fills text inside exactly
one element and never splits or joins elements. No conditionals, defaults,
command or environment expansion exist to be abused.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from pathlib import Path

# Rendering is the templates' other half; callers may know it by this module's name.
from sensorium.connectors.os.envelope.render import ARGV_MAX_BYTES as ARGV_MAX_BYTES
from sensorium.connectors.os.envelope.render import PLACEHOLDER
from sensorium.connectors.os.envelope.render import RenderError as RenderError
from sensorium.connectors.os.envelope.render import render as render
from sensorium.shared.wire.declaration import Declaration

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
# Launchers run another program named in their own argv; the catalog would then
# name the launcher, not what actually runs.
_LAUNCHERS = frozenset(
    {
        "env",
        "nice",
        "nohup",
        "timeout",
        "xargs",
        "setsid",
        "stdbuf",
        "chroot",
        "unshare",
        "nsenter",
        "ionice",
        "taskset",
        "chrt",
        "time",
        "strace",
        "ltrace",
        "script",
        "sudo",
        "su",
        "runuser",
        "doas",
        "pkexec",
        "flock",
        "busybox",
        "watch",
        "parallel",
        "sg",
        "newgrp",
        "prlimit",
        "setpriv",
        "capsh",
        "systemd-run",
    }
)
_SCALAR_TYPES = {"string", "integer", "number", "boolean"}
_TEXTLESS_TYPES = {"integer", "number", "boolean"}
# Connector values that are operator-fixed paths, never caller text.
_PATH_VALUES = frozenset({"scratch", "write_root", "artifact_dir"})
_COMMAND_FLAG = re.compile(r"^-[A-Za-z]*c[A-Za-z]*\Z")
# A flag whose argument is code (or, for find, a program to run).
_CODE_FLAG = re.compile(r"^-[A-Za-z]*[ce]\Z")
_CODE_FLAGS_LONG = frozenset(
    {"--eval", "--command", "--exec", "--execute", "-exec", "-execdir", "-ok", "-okdir"}
)
# The code attached to the flag itself: `-c{{x}}`, `--eval={{x}}`.
_CODE_ATTACHED = re.compile(r"^(-[A-Za-z]*[ce]\{\{|--(eval|command|exec|execute)=)")
# env's split-string option, short (possibly clustered) or long (possibly abbreviated).
_SPLIT_SHORT = re.compile(r"^-[A-Za-z]*S")
_SPLIT_LONG = re.compile(r"^--([a-z-]+)(=|$)")

Problem = tuple[str, str]


@functools.cache
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


def _names(path: str) -> set[str]:
    """The program names a path goes by: its base name and, if absolute, its target's."""
    names = {os.path.basename(path)}
    if path.startswith("/"):
        names.add(os.path.basename(os.path.realpath(path)))
    return names


def is_shell(path: str) -> bool:
    return not _names(path).isdisjoint(_system_shells())


def is_launcher(path: str) -> bool:
    return not _names(path).isdisjoint(_LAUNCHERS)


def placeholders(element: str) -> list[str]:
    return PLACEHOLDER.findall(element)


def _field(i: int) -> str:
    return f"executable.argv_shape[{i}]"


def check_template(decl: Declaration) -> list[Problem]:
    """Every argv-template problem as ``(field path, what is wrong)``; empty when clean."""
    exe = decl.executable
    shape = exe.argv_shape
    return [
        *_check_programs(decl),
        *_check_shell_strings(shape, _system_shells()),
        *_check_split_string(exe.path, shape),
        *_check_code_flags(shape, _text_carrier(decl)),
        *_check_placeholders(decl),
    ]


def _check_programs(decl: Declaration) -> list[Problem]:
    """The program itself: fixed by the operator, not a shell, not a launcher."""
    exe = decl.executable
    problems: list[Problem] = []
    if "{{" in exe.path or (exe.interpreter and "{{" in exe.interpreter):
        problems.append(
            (
                "executable.path",
                "the executable path is fixed by the operator; "
                "a caller-supplied executable path is not allowed",
            )
        )
    for field, prog in (("executable.path", exe.path), ("executable.interpreter", exe.interpreter)):
        if not prog:
            continue
        if is_shell(prog):
            problems.append(
                (
                    field,
                    f"{prog} is a shell; shell invocation is forbidden — name the program itself",
                )
            )
        elif is_launcher(prog):
            problems.append(
                (
                    field,
                    f"{prog} is a launcher that runs another program named in its argv; "
                    "declare the target program directly as the executable",
                )
            )
    return problems


def _words(shape: list[str]) -> list[tuple[int, str]]:
    """Every whitespace-separated word of every element, with its element's index."""
    return [(i, word) for i, element in enumerate(shape) for word in element.split()]


def _check_shell_strings(shape: list[str], shells: frozenset[str]) -> list[Problem]:
    """`env sh -c ...`, `nice bash -c ...`, `env -S "sh -c ..."`: whatever launches it, a
    shell word followed by a command-string flag is shell invocation."""
    problems: list[Problem] = []
    words = _words(shape)
    for k, (i, word) in enumerate(words):
        if i == 0 or _names(word).isdisjoint(shells):
            continue
        flag = next((w for _, w in words[k + 1 :] if _COMMAND_FLAG.match(w)), None)
        if flag and all(f != _field(i) for f, _ in problems):
            problems.append(
                (
                    _field(i),
                    f"{word!r} with {flag!r} runs a shell command string; "
                    "shell invocation is forbidden — name the program itself",
                )
            )
    return problems


def _is_split_flag(element: str) -> bool:
    if _SPLIT_SHORT.match(element):
        return True
    m = _SPLIT_LONG.match(element)
    return m is not None and "split-string".startswith(m.group(1))


def _check_split_string(path: str, shape: list[str]) -> list[Problem]:
    """`env -S STRING` re-splits STRING into a command line, so a placeholder in or after
    it could inject arguments or a whole command."""
    if "env" in _names(path):
        start = 0
    else:
        envs = [i for i, word in _words(shape) if os.path.basename(word) == "env"]
        if not envs:
            return []
        start = envs[0] + 1
    for i in range(start, len(shape)):
        if shape[i] == "--":
            return []
        if not _is_split_flag(shape[i]):
            continue
        for j in range(i, len(shape)):
            if placeholders(shape[j]):
                return [
                    (
                        _field(j),
                        f"env {shape[i]!r} splits strings into a command line, so a "
                        "placeholder at or after it could inject arguments or commands; "
                        "write each argument as its own element without -S",
                    )
                ]
        return []
    return []


def _text_carrier(decl: Declaration) -> Callable[[str], bool]:
    """Whether a placeholder can carry caller text (anything but a number, boolean or path)."""
    props = decl.parameters_schema.get("properties", {})
    props = props if isinstance(props, dict) else {}

    def carries(name: str) -> bool:
        if name in _PATH_VALUES:
            return False
        ptype = props[name].get("type") if isinstance(props.get(name), dict) else None
        types = ptype if isinstance(ptype, list) else [ptype]
        # An invalid schema (a type that is not a string) is reported elsewhere; here it
        # must only not crash the check.
        return not (types and all(isinstance(t, str) and t in _TEXTLESS_TYPES for t in types))

    return carries


def _is_code_flag(element: str) -> bool:
    return bool(_CODE_FLAG.match(element)) or element in _CODE_FLAGS_LONG


def _check_code_flags(shape: list[str], carries: Callable[[str], bool]) -> list[Problem]:
    """`python3 -c {{code}}`, `perl -e {{x}}`, `find -exec {{prog}}`: caller text as code."""
    problems: list[Problem] = []
    for i in range(1, len(shape)):
        names = [n for n in placeholders(shape[i]) if carries(n)]
        if not names:
            continue
        if i >= 2 and _is_code_flag(shape[i - 1]):
            flag = shape[i - 1]
        elif _CODE_ATTACHED.match(shape[i]):
            flag = shape[i].split("=", 1)[0].split("{{", 1)[0]
        else:
            continue
        problems.append(
            (
                _field(i),
                f"{{{{{names[0]}}}}} as the argument of {flag!r} would run caller-supplied "
                "code; keep the code (or program) literal in the template and pass caller "
                "data as later, separate arguments — if the flag takes data, not code, "
                "use its --long=value form",
            )
        )
    return problems


def _check_placeholders(decl: Declaration) -> list[Problem]:
    """Placeholders are well formed, named, provided, and scalar."""
    shape = decl.executable.argv_shape
    problems: list[Problem] = []
    if shape and placeholders(shape[0]):
        problems.append((_field(0), "argv[0] names the program and cannot come from a parameter"))
    for i, element in enumerate(shape):
        stripped = PLACEHOLDER.sub("", element)
        if "{{" in stripped or "}}" in stripped:
            problems.append(
                (_field(i), f"malformed placeholder in {element!r}; write {{{{name}}}}")
            )
        for name in placeholders(element):
            message = _placeholder_problem(decl, name)
            if message:
                problems.append((_field(i), message))
    return problems


def _placeholder_problem(decl: Declaration, name: str) -> str | None:
    if name in CONNECTOR_VALUES:
        available = {"params_json", "scratch"}
        if decl.fs_write is not None:
            available.add("write_root")
        if decl.artifact is not None:
            available.add("artifact_dir")
        if name not in available:
            return f"{{{{{name}}}}} is not provided for class {decl.class_}"
        return None
    props = decl.parameters_schema.get("properties", {})
    props = props if isinstance(props, dict) else {}
    if name not in props:
        return (
            f"placeholder {{{{{name}}}}} names no property of "
            f"parameters_schema and no connector value "
            f"({', '.join(sorted(CONNECTOR_VALUES))})"
        )
    ptype = props[name].get("type") if isinstance(props[name], dict) else None
    types = ptype if isinstance(ptype, list) else [ptype]
    if not types or not all(isinstance(t, str) and t in _SCALAR_TYPES for t in types):
        return (
            f"parameter {name!r} must declare a scalar type "
            f"({', '.join(sorted(_SCALAR_TYPES))}); structured values "
            "travel only through {{params_json}}"
        )
    return None
