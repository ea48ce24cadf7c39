"""Flow templates render in a bounded worker process: a runaway template costs its
budget and its worker, never core's event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from sensorium.core.render import Renderer
from sensorium.shared.errors import CodedError

# ~10^6 additions: seconds of CPU from 150 bytes of template.
RUNAWAY = {
    "$map": {"$eval": "range(0, 1000)"},
    "each(i)": {
        "$reduce": {"$eval": "range(0, 1000)"},
        "initial": 0,
        "each(a, j)": {"$eval": "a + j"},
    },
}


def test_a_runaway_template_is_stopped_and_the_next_one_renders() -> None:
    async def run() -> tuple[float, float, object, object]:
        renderer = Renderer(timeout_s=0.5)
        try:
            assert await renderer.render("warm", {"v": "${x}"}, {"x": 1}) == {"v": "1"}
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            tick = asyncio.create_task(ticker())
            t0 = time.monotonic()
            with pytest.raises(CodedError) as err:
                await renderer.render("heavy", RUNAWAY, {})
            took = time.monotonic() - t0
            tick.cancel()
            after = await renderer.render("next", {"v": "${x}"}, {"x": "ok"})
            return took, ticks, err.value, after
        finally:
            await renderer.close()

    took, ticks, error, after = asyncio.run(run())
    assert isinstance(error, CodedError) and error.code == "flow-invalid"
    assert "did not render within" in error.message
    assert took < 5  # the budget, not the template, decides how long it takes
    assert ticks > 10  # the event loop kept running meanwhile
    assert after == {"v": "ok"}


def test_template_errors_name_the_step() -> None:
    async def run() -> CodedError:
        renderer = Renderer()
        try:
            with pytest.raises(CodedError) as err:
                await renderer.render("greet", {"$eval": "missing.value"}, {})
            return err.value
        finally:
            await renderer.close()

    error = asyncio.run(run())
    assert error.code == "flow-invalid" and "'greet'" in error.message
