"""Flow templates render in a bounded worker process: a runaway template costs its
budget of render steps and fails the same way on every machine; the wall-clock
timeout is only a last-resort net, and neither ever stalls core's event loop."""

from __future__ import annotations

import asyncio
from typing import Any

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
# 10^10 steps: no machine renders this within any timeout a test would wait.
ENDLESS = {
    "$map": {"$eval": "range(0, 100000)"},
    "each(i)": {"$reduce": {"$eval": "range(0, 100000)"}, "initial": 0, "each(a, j)": "x"},
}


def _render(renderer: Renderer, template: Any, context: dict[str, Any]) -> Any:
    async def run() -> Any:
        try:
            return await renderer.render("step", template, context)
        except CodedError as exc:
            return exc
        finally:
            await renderer.close()

    return asyncio.run(run())


def test_a_runaway_template_is_stopped_by_its_step_budget_and_the_next_one_renders() -> None:
    async def run() -> tuple[int, object, object]:
        # A clock far out of reach: only the counted work can stop the render.
        renderer = Renderer(timeout_s=3600)
        try:
            assert await renderer.render("warm", {"v": "${x}"}, {"x": 1}) == {"v": "1"}
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0)
                    ticks += 1

            tick = asyncio.create_task(ticker())
            with pytest.raises(CodedError) as err:
                await renderer.render("heavy", RUNAWAY, {})
            tick.cancel()
            after = await renderer.render("next", {"v": "${x}"}, {"x": "ok"})
            return ticks, err.value, after
        finally:
            await renderer.close()

    ticks, error, after = asyncio.run(run())
    assert isinstance(error, CodedError) and error.code == "flow-invalid"
    assert "'heavy'" in error.message and "render steps (the render budget)" in error.message
    assert ticks > 10  # the event loop kept running meanwhile
    assert after == {"v": "ok"}


def test_the_budget_is_counted_work_so_a_template_passes_or_fails_exactly_at_its_cost() -> None:
    template = {"$map": {"$eval": "range(0, 50)"}, "each(i)": {"n": "${i}"}}
    # Find the template's cost by bisection: it renders at its cost and fails one below,
    # every time and on every machine (no clock takes part).
    low, high = 1, 100_000
    while low < high:
        mid = (low + high) // 2
        if isinstance(_render(Renderer(budget_steps=mid), template, {}), CodedError):
            low = mid + 1
        else:
            high = mid
    cost = low
    assert 50 < cost < 5_000, cost
    for _ in range(3):
        assert _render(Renderer(budget_steps=cost), template, {})[49] == {"n": "49"}
        below = _render(Renderer(budget_steps=cost - 1), template, {})
        assert isinstance(below, CodedError) and "render budget" in below.message


@pytest.mark.parametrize(
    "expression",
    [
        "range(0, 100000000000)",  # charged its length before it is built
        "2 ** 100000000",  # an integer wider than any JSON number, refused unbuilt
        "3 ** 100000",
        "split(join(range(0, 60000), ','), ',')",
    ],
)
def test_single_expensive_steps_are_charged_before_they_run(expression: str) -> None:
    got = _render(Renderer(budget_steps=50_000), {"$eval": expression}, {})
    assert isinstance(got, CodedError) and "render budget" in got.message, got


def test_comparisons_cost_their_operands() -> None:
    big = list(range(20_000))
    template = {"$map": {"$eval": "range(0, 100)"}, "each(i)": {"$eval": "i in big"}}
    got = _render(Renderer(budget_steps=100_000), template, {"big": big})
    assert isinstance(got, CodedError) and "render budget" in got.message, got


def test_the_wall_clock_net_still_catches_what_the_budget_lets_through() -> None:
    got = _render(Renderer(timeout_s=0.5, budget_steps=10**15), ENDLESS, {})
    assert isinstance(got, CodedError) and got.code == "flow-invalid"
    assert "did not render within" in got.message


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
