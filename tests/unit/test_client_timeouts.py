"""How long a client waits for an invoke's reply, and how rarely it asks the catalog."""

from __future__ import annotations

from sensorium.client.endpoint import MaxTimeouts, reply_wait_s
from sensorium.shared.config import Limits
from sensorium.shared.wire.client_api import ActionView, CatalogView


def _view(**max_ms: int) -> CatalogView:
    return CatalogView(
        actions=[
            ActionView(
                action_id=a,
                parameters_schema={},
                default_timeout_ms=1,
                max_timeout_ms=m,
                execution_mode_support="sync-only",
                state="degraded",
            )
            for a, m in max_ms.items()
        ]
    )


def test_an_unknown_action_does_not_refetch_the_catalog_on_every_call() -> None:
    cache = MaxTimeouts(refresh_s=60)
    assert cache.stale("a.b")
    cache.update(_view(**{"a.b": 5000}))
    assert not cache.stale("a.b") and cache.get("a.b") == 5000
    assert not cache.stale("no.such") and cache.get("no.such") is None


def test_the_wait_is_the_actions_own_maximum_plus_the_margin() -> None:
    margin = Limits().reply_margin_ms / 1000
    assert reply_wait_s(None, 10_000) == 10 + margin
    assert reply_wait_s(2_000, 10_000) == 2 + margin
    assert reply_wait_s(60_000, 10_000) == 10 + margin  # core clamps to the maximum too
    assert reply_wait_s(None, None) == Limits().max_action_timeout_ms / 1000 + margin
