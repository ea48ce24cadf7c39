"""Where a client finds core: an explicit endpoint, or the state directory's node config."""

from __future__ import annotations

from sensorium.shared.config import Limits, load_node_config
from sensorium.shared.config import core_endpoint as _core_endpoint
from sensorium.shared.paths import StatePaths, resolve_state_dir


def core_endpoint(endpoint: str | None = None, state_dir: str | None = None) -> str:
    if endpoint:
        return endpoint
    paths = StatePaths(resolve_state_dir(state_dir))
    return _core_endpoint(load_node_config(paths), paths)


def reply_wait_s(timeout_ms: int | None, max_timeout_ms: int | None) -> float:
    """How long to wait for an invoke's reply: the action's effective timeout (its own
    maximum when none is asked for), plus the SIGTERM grace and the hops."""
    limits = Limits()
    budget = timeout_ms if timeout_ms is not None else max_timeout_ms
    if budget is None:
        budget = limits.max_action_timeout_ms
    if max_timeout_ms is not None:
        budget = min(budget, max_timeout_ms)
    return (min(budget, limits.max_action_timeout_ms) + limits.reply_margin_ms) / 1000
