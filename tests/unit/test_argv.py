"""Argv templates: rendering keeps one element per template element, load-time rules hold."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from sensorium.connectors.os.argv import RenderError, check_template, render
from sensorium.shared.wire.declaration import Declaration

# --- render -----------------------------------------------------------------------------

HOSTILE_VALUES = [
    "two words",
    'it\'s "quoted"',
    "a; rm -rf /",
    "$(id)",
    "`id`",
    "line one\nline two",
    "-rf",
    "--help",
    "${HOME}",
    "*",
    "a | b && c > d",
    "back\\1slash",
    "{{other}}",
    "",
]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_hostile_string_stays_one_verbatim_element(value: str) -> None:
    out = render(["cat", "--", "{{path}}"], {"path": value, "other": "X"}, {})
    assert out == ["cat", "--", value]


def test_output_has_one_element_per_template_element() -> None:
    shape = ["prog", "{{a}}", "--flag", "{{b}}", "{{a}}{{b}}", "literal"]
    out = render(shape, {"a": "x y", "b": "1 2 3"}, {})
    assert len(out) == len(shape)
    assert out == ["prog", "x y", "--flag", "1 2 3", "x y1 2 3", "literal"]


def test_template_without_placeholders_is_copied() -> None:
    assert render(["cat", "/proc/uptime"], {}, {}) == ["cat", "/proc/uptime"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (42, "42"),
        (-7, "-7"),
        (0, "0"),
        (True, "true"),
        (False, "false"),
        (1.5, "1.5"),
    ],
)
def test_scalars_render_as_text(value: Any, text: str) -> None:
    assert render(["prog", "{{v}}"], {"v": value}, {}) == ["prog", text]


def test_embedded_placeholder_fills_inside_the_element() -> None:
    out = render(["head", "--lines={{n}}", "--", "{{path}}"], {"n": 5, "path": "/etc/hosts"}, {})
    assert out == ["head", "--lines=5", "--", "/etc/hosts"]


def test_missing_parameter_raises_with_its_name() -> None:
    with pytest.raises(RenderError) as info:
        render(["head", "--lines={{n}}"], {}, {})
    assert info.value.name == "n"


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}, None])
def test_non_scalar_value_is_refused(value: Any) -> None:
    with pytest.raises(RenderError) as info:
        render(["prog", "{{v}}"], {"v": value}, {})
    assert info.value.name == "v"


def test_nul_byte_in_value_is_refused() -> None:
    with pytest.raises(RenderError):
        render(["prog", "{{v}}"], {"v": "a\0b"}, {})


def test_params_json_is_canonical_json_of_the_params() -> None:
    params = {"zeta": 1, "alpha": "x y", "mid": {"b": [1, 2], "a": True}}
    (out,) = render(["{{params_json}}"], params, {})
    assert out == '{"alpha":"x y","mid":{"a":true,"b":[1,2]},"zeta":1}'
    assert json.loads(out) == params


def test_params_json_may_carry_structured_values() -> None:
    (out,) = render(["{{params_json}}"], {"list": [1, "two"], "n": None}, {})
    assert out == '{"list":[1,"two"],"n":null}'


def test_connector_values_fill_their_placeholders() -> None:
    out = render(["prog", "--out={{scratch}}/x"], {}, {"scratch": "/state/scratch/01"})
    assert out == ["prog", "--out=/state/scratch/01/x"]


def test_params_json_out_of_range_integer_raises_render_error() -> None:
    with pytest.raises(RenderError):
        render(["{{params_json}}"], {"n": 2**60}, {})


# --- check_template ---------------------------------------------------------------------


def _decl(
    executable: dict[str, Any], properties: dict[str, Any] | None = None, **extra: Any
) -> Declaration:
    doc: dict[str, Any] = {
        "action_id": "test.argv",
        "class": "read-only-spawn",
        "executable": {"kind": "binary", **executable},
        "parameters_schema": {"type": "object", "properties": properties or {}},
        **extra,
    }
    return msgspec.convert(doc, type=Declaration)


def _fields(decl: Declaration) -> list[str]:
    return [field for field, _ in check_template(decl)]


def test_clean_declaration_has_no_problems() -> None:
    decl = _decl(
        {
            "path": "/usr/bin/head",
            "argv_shape": [
                "head",
                "--lines={{n}}",
                "--",
                "{{path}}",
                "{{params_json}}",
                "{{scratch}}",
            ],
        },
        {"n": {"type": "integer"}, "path": {"type": "string"}},
    )
    assert check_template(decl) == []


@pytest.mark.parametrize("shell", ["/bin/sh", "/usr/bin/bash", "/bin/dash"])
def test_shell_as_executable_is_rejected(shell: str) -> None:
    decl = _decl({"path": shell, "argv_shape": ["sh", "-c", "id"]})
    assert "executable.path" in _fields(decl)


def test_env_running_a_shell_command_string_is_rejected() -> None:
    decl = _decl({"path": "/usr/bin/env", "argv_shape": ["env", "sh", "-c", "id"]})
    assert "executable.argv_shape[1]" in _fields(decl)


def test_env_shell_with_option_before_command_flag_is_rejected() -> None:
    decl = _decl({"path": "/usr/bin/env", "argv_shape": ["env", "bash", "--norc", "-c", "id"]})
    assert check_template(decl) != []


def test_shell_interpreter_is_rejected() -> None:
    decl = _decl(
        {
            "kind": "script",
            "path": "/opt/scripts/run",
            "interpreter": "/bin/bash",
            "argv_shape": ["run"],
        },
        script={"allowed_roots": ["/opt/scripts"]},
    )
    assert "executable.interpreter" in _fields(decl)


def test_placeholder_in_argv0_is_rejected() -> None:
    decl = _decl(
        {"path": "/usr/bin/cat", "argv_shape": ["{{name}}", "x"]}, {"name": {"type": "string"}}
    )
    assert "executable.argv_shape[0]" in _fields(decl)


def test_unknown_placeholder_is_rejected() -> None:
    decl = _decl({"path": "/usr/bin/cat", "argv_shape": ["cat", "{{nope}}"]})
    assert _fields(decl) == ["executable.argv_shape[1]"]


def test_placeholder_absent_from_parameters_schema_is_rejected() -> None:
    decl = _decl(
        {"path": "/usr/bin/cat", "argv_shape": ["cat", "{{path}}", "{{other}}"]},
        {"path": {"type": "string"}},
    )
    assert _fields(decl) == ["executable.argv_shape[2]"]


@pytest.mark.parametrize("ptype", ["object", "array"])
def test_placeholder_of_structured_parameter_is_rejected(ptype: str) -> None:
    decl = _decl({"path": "/usr/bin/cat", "argv_shape": ["cat", "{{v}}"]}, {"v": {"type": ptype}})
    assert _fields(decl) == ["executable.argv_shape[1]"]


def test_placeholder_of_untyped_parameter_is_rejected() -> None:
    decl = _decl({"path": "/usr/bin/cat", "argv_shape": ["cat", "{{v}}"]}, {"v": {}})
    assert _fields(decl) == ["executable.argv_shape[1]"]


def test_placeholder_with_list_type_is_reported_not_raised() -> None:
    decl = _decl(
        {"path": "/usr/bin/cat", "argv_shape": ["cat", "{{v}}"]},
        {"v": {"type": ["string", "null"]}},
    )
    assert isinstance(check_template(decl), list)


@pytest.mark.parametrize("element", ["{{ x", "{{x}", "x}}", "{{ x }}", "--a={{x"])
def test_malformed_placeholder_is_rejected(element: str) -> None:
    decl = _decl(
        {"path": "/usr/bin/cat", "argv_shape": ["cat", element]}, {"x": {"type": "string"}}
    )
    assert "executable.argv_shape[1]" in _fields(decl)


def test_write_root_without_fs_write_is_rejected() -> None:
    decl = _decl({"path": "/usr/bin/touch", "argv_shape": ["touch", "{{write_root}}/x"]})
    assert _fields(decl) == ["executable.argv_shape[1]"]


def test_write_root_with_fs_write_is_allowed() -> None:
    decl = _decl(
        {"path": "/usr/bin/touch", "argv_shape": ["touch", "{{write_root}}/x"]},
        fs_write={"write_root": "/srv/out", "max_bytes_total": 10, "max_bytes_per_file": 10},
    )
    assert check_template(decl) == []


def test_artifact_dir_without_artifact_block_is_rejected() -> None:
    decl = _decl({"path": "/usr/bin/cp", "argv_shape": ["cp", "a", "{{artifact_dir}}"]})
    assert _fields(decl) == ["executable.argv_shape[2]"]


def test_placeholder_in_executable_path_is_rejected() -> None:
    decl = _decl(
        {"path": "/usr/bin/{{prog}}", "argv_shape": ["prog"]}, {"prog": {"type": "string"}}
    )
    assert "executable.path" in _fields(decl)
