"""Core's resolution map: built from a module report, validates parameters with paths."""

from __future__ import annotations

from typing import Any

import pytest

from sensorium.core.resolution import MAX_REPORTED_ERRORS, ResolutionMap
from sensorium.shared.wire.report import ConnectorAction, ModuleReport, RuntimeProbe

HEAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["path", "lines"],
    "properties": {
        "path": {"type": "string", "pattern": "^/"},
        "lines": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}


def _action(
    action_id: str = "demo.fs.read-head",
    *,
    state: str = "enabled",
    schema: dict[str, Any] | None = None,
) -> ConnectorAction:
    return ConnectorAction(
        action_id=action_id,
        class_="read-only-spawn",
        parameters_schema=HEAD_SCHEMA if schema is None else schema,
        default_timeout_ms=5000,
        max_timeout_ms=30000,
        state=state,  # type: ignore[arg-type]
    )


def _report(*actions: ConnectorAction, exposed: bool = True) -> ModuleReport:
    return ModuleReport(
        module_id="sensorium-os",
        instance_id="01TESTINSTANCE",
        started_at="2025-01-01T00:00:00Z",
        config_hash="0" * 64,
        config_authorized=True,
        config_authorization="signed",
        catalog_exposed=exposed,
        connector_actions=list(actions),
        runtime=RuntimeProbe(platform="linux", uid=1000),
    )


def _resolved(schema: dict[str, Any] | None = None) -> Any:
    rmap = ResolutionMap()
    rmap.load(_report(_action(schema=schema)))
    resolved = rmap.get("demo.fs.read-head")
    assert resolved is not None
    return resolved


def _paths(schema: dict[str, Any] | None, params: dict[str, Any]) -> list[str]:
    return [e.path for e in _resolved(schema).check(params)]


def test_loaded_action_resolves() -> None:
    rmap = ResolutionMap()
    rmap.load(_report(_action(), _action("demo.system.uptime")))
    resolved = rmap.get("demo.fs.read-head")
    assert resolved is not None
    assert resolved.action.action_id == "demo.fs.read-head"
    assert set(rmap.actions) == {"demo.fs.read-head", "demo.system.uptime"}


def test_unknown_action_is_none() -> None:
    rmap = ResolutionMap()
    rmap.load(_report(_action()))
    assert rmap.get("demo.no.such") is None


def test_empty_map_resolves_nothing() -> None:
    assert ResolutionMap().get("demo.fs.read-head") is None


def test_unexposed_catalog_yields_no_actions() -> None:
    rmap = ResolutionMap()
    rmap.load(_report(_action(), exposed=False))
    assert rmap.actions == {}
    assert rmap.get("demo.fs.read-head") is None


def test_new_report_replaces_the_previous_whole() -> None:
    rmap = ResolutionMap()
    rmap.load(_report(_action("demo.a.one")))
    rmap.load(_report(_action("demo.b.two")))
    assert rmap.get("demo.a.one") is None
    assert rmap.get("demo.b.two") is not None


def test_clear_forgets_everything() -> None:
    rmap = ResolutionMap()
    rmap.load(_report(_action()))
    rmap.clear()
    assert rmap.report is None
    assert rmap.get("demo.fs.read-head") is None


@pytest.mark.parametrize(
    ("state", "runnable"),
    [
        ("enabled", True),
        ("degraded", True),
        ("unsupported_by_runtime", False),
        ("blocked_by_policy", False),
        ("failed", False),
    ],
)
def test_runnable_follows_the_ledger_state(state: str, runnable: bool) -> None:
    rmap = ResolutionMap()
    rmap.load(_report(_action(state=state)))
    resolved = rmap.get("demo.fs.read-head")
    assert resolved is not None
    assert resolved.runnable is runnable


def test_valid_parameters_have_no_errors() -> None:
    assert _resolved().check({"path": "/etc/hosts", "lines": 3}) == []


def test_wrong_type_points_at_the_property() -> None:
    errors = _resolved().check({"path": "/etc/hosts", "lines": "ten"})
    assert [e.path for e in errors] == ["$.parameters.lines"]
    assert "integer" in errors[0].message


def test_missing_required_property_points_at_it() -> None:
    assert _paths(None, {"lines": 3}) == ["$.parameters.path"]


def test_additional_property_points_at_the_parameters() -> None:
    assert _paths(None, {"path": "/x", "lines": 1, "extra": 1}) == ["$.parameters"]


def test_nested_and_array_paths() -> None:
    schema = {
        "type": "object",
        "properties": {
            "opts": {
                "type": "object",
                "properties": {"items": {"type": "array", "items": {"type": "integer"}}},
            }
        },
    }
    assert _paths(schema, {"opts": {"items": [1, "x"]}}) == ["$.parameters.opts.items[1]"]


def test_every_failing_location_is_reported() -> None:
    paths = _paths(None, {"path": 5, "lines": 0})
    assert paths == ["$.parameters.lines", "$.parameters.path"]


def test_at_most_ten_errors_are_reported() -> None:
    props = {f"p{i:02d}": {"type": "integer"} for i in range(15)}
    schema = {"type": "object", "properties": props}
    errors = _resolved(schema).check({name: "x" for name in props})
    assert len(errors) == MAX_REPORTED_ERRORS == 10


def test_each_missing_required_property_points_at_itself() -> None:
    assert sorted(_paths(None, {})) == ["$.parameters.lines", "$.parameters.path"]
