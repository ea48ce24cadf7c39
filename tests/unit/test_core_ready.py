"""What core's READY=1 waits for: the connector's first report, a stop, or
``limits.core_ready_wait_s``, whichever comes first; and the config that bounds it.
Each case is ordered by events (an Event set by the loop), never by a clock."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import zmq.asyncio

from sensorium.core.catalog_desk import CatalogDesk
from sensorium.core.resolution import ResolutionMap
from sensorium.shared.config import ConfigError, load_node_config
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.client import RpcClient
from sensorium.shared.sdnotify import Notifier

LONG_S = 600.0  # never reached: each case below ends by an event first


async def _wait(tmp_path: Path, *, reported: bool, then: str | None, within_s: float) -> bool:
    ctx = zmq.asyncio.Context()
    # A real seam client to nowhere: it never connects, so no report comes by itself.
    connector = RpcClient(ctx, f"ipc://{tmp_path}/absent.sock", name="connector")
    desk = CatalogDesk(connector, ResolutionMap(), Notifier({}))
    stop = asyncio.Event()
    try:
        if reported:
            desk.reported.set()
        loop = asyncio.get_running_loop()
        if then == "report":
            loop.call_soon(desk.reported.set)
        elif then == "stop":
            loop.call_soon(stop.set)
        before = asyncio.all_tasks()
        got = await desk.first_report(within_s, stop)
        # Nothing of the wait is left running (the seam client's own tasks are its own).
        assert asyncio.all_tasks() == before
        return got
    finally:
        await connector.close()
        ctx.term()


@pytest.mark.parametrize(
    ("reported", "then", "within_s", "expected"),
    [
        (True, None, LONG_S, True),  # the report came during start-up
        (False, "report", LONG_S, True),  # it comes while core waits
        (False, "stop", LONG_S, False),  # core is told to stop first
        (False, None, 0.0, False),  # 0: READY at once, as before the wait existed
        (True, None, 0.0, True),
    ],
)
def test_ready_waits_for_the_first_report_a_stop_or_its_bound(
    tmp_path: Path, reported: bool, then: str | None, within_s: float, expected: bool
) -> None:
    assert asyncio.run(_wait(tmp_path, reported=reported, then=then, within_s=within_s)) is expected


def test_the_bound_elapses_without_a_report(tmp_path: Path) -> None:
    # Whatever the machine's speed, no report and no stop can only end in False.
    assert asyncio.run(_wait(tmp_path, reported=False, then=None, within_s=0.05)) is False


def test_the_wait_is_at_most_half_the_supervisors_ready_timeout(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.node_config.parent.mkdir(parents=True)
    assert load_node_config(paths).limits.core_ready_wait_s == 5.0
    paths.node_config.write_text(
        json.dumps({"limits": {"core_ready_wait_s": 16}, "supervisor": {"ready_timeout_s": 30}})
    )
    with pytest.raises(ConfigError, match=r"core_ready_wait_s \(16.0 s\) must be at most half"):
        load_node_config(paths)
    paths.node_config.write_text(
        json.dumps({"limits": {"core_ready_wait_s": 15}, "supervisor": {"ready_timeout_s": 30}})
    )
    assert load_node_config(paths).limits.core_ready_wait_s == 15
    paths.node_config.write_text(json.dumps({"limits": {"core_ready_wait_s": -1}}))
    with pytest.raises(ConfigError, match="core_ready_wait_s"):
        load_node_config(paths)
    paths.node_config.write_text(json.dumps({"limits": {"core_ready_wait_s": 0}}))
    assert load_node_config(paths).limits.core_ready_wait_s == 0
