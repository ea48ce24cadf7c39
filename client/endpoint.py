"""Where a client finds core: an explicit endpoint, or the state directory's node config."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sensorium.shared.config import ConfigError, Limits, load_node_config
from sensorium.shared.config import core_endpoint as _core_endpoint
from sensorium.shared.paths import StatePaths, resolve_state_dir
from sensorium.shared.rpc.curve import ClientKeys, is_tcp
from sensorium.shared.rpc.curvekeys import CORE, SERVER, CurveKeyError, CurveStore
from sensorium.shared.wire.client_api import CatalogView

# A control request's reply wait (status, cancel, list, describe).
CONTROL_TIMEOUT_S = 5.0
MODULE_ID_ENV = "SENSORIUM_MODULE_ID"


def module_id(explicit: str | None = None, fallback: str | None = None) -> str:
    """The ``issuer.module_id`` a client's directives carry: ``explicit``, else
    ``$SENSORIUM_MODULE_ID``, else ``fallback``, else the process's name."""
    for candidate in (explicit, os.environ.get(MODULE_ID_ENV), fallback):
        if candidate:
            return candidate
    return Path(sys.argv[0] if sys.argv and sys.argv[0] else "").name or "python"


def core_endpoint(endpoint: str | None = None, state_dir: str | None = None) -> str:
    if endpoint:
        return endpoint
    paths = StatePaths(resolve_state_dir(state_dir))
    return _core_endpoint(load_node_config(paths), paths)


def core_curve(endpoint: str, state_dir: str | None, curve: ClientKeys | None) -> ClientKeys | None:
    """CURVE keys for core: those given; for a tcp endpoint without them, the node's own
    (``keys/curve/core.key_secret`` of the state directory, so the node's operator and
    CLI need nothing more); for ipc, none (the run directory's 0700 is the guard)."""
    if curve is not None or not is_tcp(endpoint):
        return curve
    store = CurveStore(StatePaths(resolve_state_dir(state_dir)))
    try:
        pair = store.pair(CORE)
        server = store.public(SERVER)
    except (OSError, CurveKeyError) as exc:
        raise ConfigError(
            f"core's endpoint {endpoint} is tcp, served only with CURVE: pass "
            "curve=ClientKeys.load(PATH) (`sensorium keys client add` makes one), or run "
            f"on the node as a user who can read {store.root} ({exc})"
        ) from None
    assert pair.secret_key is not None
    return ClientKeys(pair.public_key, pair.secret_key, server)


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


class MaxTimeouts:
    """Each action's declared maximum timeout, learned from the catalog at most every
    ``refresh_s`` — an unknown action id must not cost a catalog fetch per call."""

    def __init__(self, refresh_s: float = 5.0) -> None:
        self._known: dict[str, int] = {}
        self._defaults: dict[str, int] = {}
        self._fetched_at: float | None = None
        self._refresh_s = refresh_s

    def stale(self, action_id: str) -> bool:
        if action_id in self._known:
            return False
        return self._fetched_at is None or time.monotonic() - self._fetched_at > self._refresh_s

    def update(self, view: CatalogView) -> None:
        self._known = {a.action_id: a.max_timeout_ms for a in view.actions}
        self._defaults = {a.action_id: a.default_timeout_ms for a in view.actions}
        self._fetched_at = time.monotonic()

    def get(self, action_id: str) -> int | None:
        return self._known.get(action_id)

    def default(self, action_id: str) -> int | None:
        """The action's ``default_timeout_ms``: what a directive sends when its caller
        names no timeout (the contract requires ``timing.timeout_ms``)."""
        return self._defaults.get(action_id)
