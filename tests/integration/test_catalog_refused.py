"""A catalog that fails seed 048's load-time rules is refused whole, on a running node,
with every problem in one report (issue 18, items 9, 10, 12)."""

from __future__ import annotations

import pytest
from harness import TEST_ACTIONS, start_stack

from sensorium.client import SensoriumError
from sensorium.shared.paths import StatePaths


def test_a_missing_program_refuses_the_whole_catalog_with_every_problem(
    state_dir: StatePaths,
) -> None:
    missing = dict(
        TEST_ACTIONS[0],
        action_id="test.missing",
        executable={"kind": "binary", "path": "/usr/bin/sensorium-absent", "argv_shape": ["x"]},
    )
    bad_schema = dict(TEST_ACTIONS[0], action_id="test.bad-schema", parameters_schema={"type": 7})
    elsewhere = dict(TEST_ACTIONS[0], action_id="test.elsewhere", connector_id="sensorium-web")
    s = start_stack(state_dir, [TEST_ACTIONS[0], missing, bad_schema, elsewhere])
    try:
        s.wait_ready(actions=False)
        s.wait_connected()
        # Not a partial catalog: the valid action is refused as well.
        with s.client() as c, pytest.raises(SensoriumError) as err:
            c.invoke("test.echo-args", {"value": "x"})
        assert err.value.code == "catalog-invalid", err.value
        shown = s.cli("catalog", "show")
        assert shown.returncode == 1
        out = shown.stdout
        assert "/usr/bin/sensorium-absent is missing or not executable" in out
        assert "[test.bad-schema] parameters_schema" in out
        assert "[parameters-schema-invalid]" in out
        assert "'sensorium-web'" in out and "'sensorium-os'" in out
    finally:
        s.stop()
