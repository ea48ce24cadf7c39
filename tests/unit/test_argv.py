"""Argv templates: rendering keeps one element per template element, load-time rules hold."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from sensorium.connectors.os.envelope.argv import RenderError, check_template, render
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


# --- render: option injection ------------------------------------------------------------


@pytest.mark.parametrize("value", ["-rf", "--help", "-", "--", "--output=/etc/passwd"])
def test_leading_dash_value_filling_a_whole_element_is_refused(value: str) -> None:
    with pytest.raises(RenderError) as info:
        render(["rm", "{{path}}"], {"path": value}, {})
    assert info.value.name == "path"
    assert "'--' before it" in str(info.value)
    assert "forbid a leading '-'" in str(info.value)


def test_leading_dash_value_after_literal_double_dash_is_allowed() -> None:
    out = render(["rm", "-f", "--", "{{a}}", "{{b}}"], {"a": "-rf", "b": "--help"}, {})
    assert out == ["rm", "-f", "--", "-rf", "--help"]


def test_leading_dash_value_embedded_after_literal_text_is_allowed() -> None:
    out = render(["head", "--lines={{n}}", "x{{s}}"], {"n": "-5", "s": "-y"}, {})
    assert out == ["head", "--lines=-5", "x-y"]


def test_leading_dash_value_starting_an_element_is_refused() -> None:
    with pytest.raises(RenderError) as info:
        render(["prog", "{{name}}.txt"], {"name": "--help"}, {})
    assert info.value.name == "name"


def test_empty_leading_value_passes_the_check_to_the_next_placeholder() -> None:
    with pytest.raises(RenderError) as info:
        render(["prog", "{{a}}{{b}}"], {"a": "", "b": "-x"}, {})
    assert info.value.name == "b"
    assert render(["prog", "{{a}}{{b}}"], {"a": "x", "b": "-y"}, {}) == ["prog", "x-y"]


def test_value_that_renders_as_double_dash_does_not_end_options() -> None:
    with pytest.raises(RenderError):
        render(["prog", "{{a}}", "{{b}}"], {"a": "--", "b": "-x"}, {})


def test_double_dash_inside_a_literal_element_does_not_end_options() -> None:
    with pytest.raises(RenderError):
        render(["prog", "--x=--", "{{b}}"], {"b": "-x"}, {})


def test_negative_number_is_not_an_option_injection() -> None:
    assert render(["prog", "{{n}}"], {"n": -3}, {}) == ["prog", "-3"]


def test_connector_values_are_not_checked_for_a_leading_dash() -> None:
    assert render(["prog", "{{scratch}}"], {}, {"scratch": "-odd"}) == ["prog", "-odd"]


# --- render: numbers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [(5.0, "5"), (0.0, "0"), (-0.0, "0"), (1e20, "100000000000000000000"), (2.5, "2.5")],
)
def test_floats_render_integral_values_without_a_fraction(value: float, text: str) -> None:
    assert render(["prog", "--n={{v}}"], {"v": value}, {}) == ["prog", f"--n={text}"]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_float_is_refused(value: float) -> None:
    with pytest.raises(RenderError) as info:
        render(["prog", "--n={{v}}"], {"v": value}, {})
    assert info.value.name == "v"
    assert "finite" in str(info.value)


# --- check_template: shell command strings inside one element ----------------------------


def _problems(decl: Declaration) -> dict[str, str]:
    return dict(check_template(decl))


@pytest.mark.parametrize("element", ["sh -c {{cmd}}", "bash  -ec id", "/bin/sh -c x"])
def test_shell_and_command_flag_inside_one_element_are_rejected(element: str) -> None:
    decl = _decl(
        {"path": "/opt/bin/runner", "argv_shape": ["runner", "x", element]},
        {"cmd": {"type": "string"}},
    )
    assert "shell" in _problems(decl)["executable.argv_shape[2]"]


def test_env_split_string_running_a_shell_is_rejected() -> None:
    decl = _decl(
        {"path": "/usr/bin/env", "argv_shape": ["env", "-S", "sh -c {{cmd}}"]},
        {"cmd": {"type": "string"}},
    )
    fields = _fields(decl)
    assert "executable.path" in fields
    assert "executable.argv_shape[2]" in fields


def test_shell_word_without_command_flag_is_allowed() -> None:
    decl = _decl({"path": "/usr/bin/grep", "argv_shape": ["grep", "-F", "bash -x", "/etc/shells"]})
    assert check_template(decl) == []


# --- check_template: env -S / --split-string ---------------------------------------------


@pytest.mark.parametrize(
    ("shape", "index"),
    [
        (["runner", "env", "-S", "prog {{x}}"], 3),
        (["runner", "env", "-S{{x}}"], 2),
        (["runner", "env", "-iS", "{{x}}"], 3),
        (["runner", "env", "--split-string={{x}}"], 2),
        (["runner", "env", "--split-string", "{{x}}"], 3),
        (["runner", "env", "--split={{x}}"], 2),
        (["runner", "/usr/bin/env", "-S", "python3 -c", "{{x}}"], 4),
    ],
)
def test_env_split_string_with_a_placeholder_is_rejected(shape: list[str], index: int) -> None:
    decl = _decl({"path": "/opt/bin/runner", "argv_shape": shape}, {"x": {"type": "string"}})
    message = _problems(decl)[f"executable.argv_shape[{index}]"]
    assert "own element" in message


def test_env_as_executable_with_split_string_placeholder_is_rejected() -> None:
    decl = _decl(
        {"path": "/usr/bin/env", "argv_shape": ["env", "-S", "prog {{x}}"]},
        {"x": {"type": "string"}},
    )
    assert "executable.argv_shape[2]" in _fields(decl)


@pytest.mark.parametrize(
    "shape",
    [
        ["runner", "env", "-S", "prog --flag", "literal"],
        ["runner", "sort", "-S", "{{x}}"],
        ["runner", "env", "--", "prog", "-S", "{{x}}"],
    ],
)
def test_split_string_rule_is_limited_to_env_with_placeholders(shape: list[str]) -> None:
    decl = _decl({"path": "/opt/bin/runner", "argv_shape": shape}, {"x": {"type": "string"}})
    assert check_template(decl) == []


# --- check_template: launchers -----------------------------------------------------------

LAUNCHERS = [
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
]


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_as_executable_is_rejected(name: str) -> None:
    decl = _decl({"path": f"/usr/bin/{name}", "argv_shape": [name, "cat", "/proc/uptime"]})
    problems = _problems(decl)
    assert "executable.path" in problems
    assert "declare the target program directly" in problems["executable.path"] or (
        "shell" in problems["executable.path"]
    )


def test_launcher_reached_through_a_symlink_is_rejected(tmp_path: Any) -> None:
    target = tmp_path / "nohup"
    target.write_text("")
    link = tmp_path / "innocent"
    link.symlink_to(target)
    decl = _decl({"path": str(link), "argv_shape": ["innocent", "cat", "/proc/uptime"]})
    assert "declare the target program directly" in _problems(decl)["executable.path"]


def test_launcher_as_interpreter_is_rejected() -> None:
    decl = _decl(
        {
            "kind": "script",
            "path": "/opt/scripts/run",
            "interpreter": "/usr/bin/nice",
            "argv_shape": ["run"],
        },
        script={"allowed_roots": ["/opt/scripts"]},
    )
    assert "declare the target program directly" in _problems(decl)["executable.interpreter"]


# --- check_template: caller-supplied code ------------------------------------------------


@pytest.mark.parametrize(
    ("prog", "flag"),
    [
        ("python3", "-c"),
        ("python3", "-Bc"),
        ("perl", "-e"),
        ("perl", "-ne"),
        ("ruby", "-e"),
        ("node", "--eval"),
        ("node", "-e"),
        ("php", "--execute"),
        ("psql", "--command"),
        ("tool", "--exec"),
        ("find", "-exec"),
        ("find", "-execdir"),
        ("find", "-ok"),
        ("find", "-okdir"),
    ],
)
def test_placeholder_after_code_flag_is_rejected(prog: str, flag: str) -> None:
    decl = _decl(
        {"path": f"/usr/bin/{prog}", "argv_shape": [prog, flag, "{{x}}"]},
        {"x": {"type": "string"}},
    )
    assert "caller-supplied code" in _problems(decl)["executable.argv_shape[2]"]


def test_find_exec_with_caller_program_is_rejected() -> None:
    decl = _decl(
        {
            "path": "/usr/bin/find",
            "argv_shape": ["find", "/srv", "-exec", "{{prog}}", "{}", ";"],
        },
        {"prog": {"type": "string"}},
    )
    assert _fields(decl) == ["executable.argv_shape[3]"]


@pytest.mark.parametrize(
    "shape",
    [
        ["python3", "-c", "print('{{x}}')"],
        ["find", "/srv", "-exec", "/usr/bin/{{x}}", ";"],
        ["python3", "-c{{x}}"],
        ["node", "--eval={{x}}"],
        ["python3", "-c", "{{params_json}}"],
    ],
)
def test_caller_text_inside_or_attached_to_code_is_rejected(shape: list[str]) -> None:
    decl = _decl({"path": "/usr/bin/prog", "argv_shape": shape}, {"x": {"type": "string"}})
    assert any("caller-supplied code" in message for _, message in check_template(decl))


@pytest.mark.parametrize(
    ("shape", "ptype"),
    [
        (["head", "-c", "{{x}}", "--", "/etc/hosts"], "integer"),
        (["ping", "-c", "{{x}}", "--", "localhost"], ["integer", "number"]),
        (["tool", "-e", "{{x}}"], "boolean"),
        (["python3", "-c", "import sys; print(sys.argv[1])", "{{x}}"], "string"),
        (["python3", "-c", "print(1)", "{{params_json}}"], "string"),
        (["tool", "-c", "{{scratch}}/config"], "string"),
        (["tool", "--color={{x}}"], "string"),
    ],
)
def test_code_flag_rule_spares_data_that_cannot_be_code(shape: list[str], ptype: Any) -> None:
    decl = _decl({"path": "/usr/bin/tool", "argv_shape": shape}, {"x": {"type": ptype}})
    assert check_template(decl) == []
