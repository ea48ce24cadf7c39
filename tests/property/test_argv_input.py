"""Argv templates and parameters built to break the renderer: placeholders that name
nothing, values no argv element holds, NUL bytes, options, and sizes past the kernel's.

Invariant: ``argv.render`` returns one element per template element within
``ARGV_MAX_BYTES``, or raises RenderError (parameters-invalid at the connector).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fuzz_argv import argv_cases
from fuzz_targets import ACCEPTED, PROPERTY, ArgvCase, argv, bounded
from hypothesis import given

from sensorium.connectors.os.catalog import sources as catalog_mod
from sensorium.connectors.os.envelope.argv import ARGV_MAX_BYTES, RenderError, render


@PROPERTY
@given(argv_cases())
def test_render_fits_the_command_line_or_refuses_with_a_code(case: ArgvCase) -> None:
    with bounded():
        assert argv(case) in {ACCEPTED, "parameters-invalid"}


def _refused(shape: list[str], params: dict[str, Any]) -> str:
    with pytest.raises(RenderError) as info:
        render(shape, params, {})
    return str(info.value)


def test_one_element_past_the_kernel_limit_is_refused_before_spawning() -> None:
    # Measured before this cap: 140,000 bytes got spawn-failed (E2BIG), 300,000 got
    # spawn-failed from the zygote (EMSGSIZE): the caller's parameter, blamed on the node.
    assert "over 131072 bytes" in _refused(["echo", "{{v}}"], {"v": "x" * 140_000})
    out = render(["echo", "{{v}}"], {"v": "x" * (ARGV_MAX_BYTES - 10)}, {})
    assert len(out[1]) == ARGV_MAX_BYTES - 10


def test_a_template_repeating_a_placeholder_stops_early_not_after_building_gigabytes() -> None:
    shape = ["echo", *["{{v}}" * 400] * 255]
    t0 = time.monotonic()
    assert "parameter 'v'" in _refused(shape, {"v": "x" * 100_000})
    assert time.monotonic() - t0 < 1


def test_params_json_of_deep_or_unencodable_parameters_is_refused() -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    assert "nested too deeply" in _refused(["p", "{{params_json}}"], {"v": deep})
    assert "canonical JSON" in _refused(["p", "{{params_json}}"], {"v": 2**64})
    assert "canonical JSON" in _refused(["p", "{{params_json}}"], {"v": float("nan")})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), [1], {"a": 1}, None, "\ud800"])
def test_values_no_argv_element_holds_are_refused(value: object) -> None:
    _refused(["p", "{{v}}"], {"v": value})


@pytest.mark.parametrize("value", [10**400, 2**64, 1e308, 5e-324, -(2**63)])
def test_huge_numbers_render_as_their_digits(value: float) -> None:
    [_, text] = render(["p", "{{v}}"], {"v": value}, {})
    assert text and len(text) < 500


@pytest.mark.parametrize("ptype", [[{}], [["string"]], {"a": 1}, [None, 1.5]])
def test_a_placeholder_typed_with_junk_is_a_problem_not_a_crash(ptype: object) -> None:
    """Found by bench/fuzz_inputs.py: a non-string in a property's type list crashed the
    code-flag check with TypeError (unhashable dict) and, with it, the catalog load."""
    decl = {
        "action_id": "fuzz.py",
        "class": "read-only-spawn",
        "executable": {
            "kind": "binary",
            "path": "/usr/bin/python3",
            "argv_shape": ["python3", "-c", "{{code}}"],
        },
        "parameters_schema": {"type": "object", "properties": {"code": {"type": ptype}}},
    }
    problems: list[catalog_mod.Problem] = []
    assert catalog_mod.validate_declaration(decl, "f.json", problems) is None
    assert problems
