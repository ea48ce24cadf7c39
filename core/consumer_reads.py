"""The consumer read paths of proposal 045 §7 on core's client API.

``sensorium.directive.list``, ``sensorium.observe.query``, ``sensorium.observation.get``
and ``sensorium.topic.summary`` (``sensorium.health`` is core's ``health`` under its
045 name). Any allowlisted key may ask; what it gets is scoped by its grants
(``core/grants.py``): the actions it may invoke, and the observations of those
actions. The operator (ipc, or the node's own key) sees everything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any

from sensorium.core import observation_query, observations
from sensorium.core.access import Access
from sensorium.core.audit import AuditStore
from sensorium.core.grants import GroupOf, granted
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import ObservationConfig
from sensorium.shared.wire.client_api import (
    CatalogDescribe,
    CatalogView,
    DirectiveList,
    DirectiveListRequest,
    ObservationGet,
    ObservationPage,
    ObserveQuery,
    TopicSummary,
    TopicSummaryRequest,
)
from sensorium.shared.wire.observation import Observation

Describe = Callable[[CatalogDescribe], Awaitable[CatalogView]]


class ConsumerReads:
    def __init__(
        self,
        audit: AuditStore,
        access: Access,
        group_of: GroupOf,
        describe: Describe,
        cfg: ObservationConfig,
    ) -> None:
        self._audit = audit
        self._access = access
        self._group_of = group_of
        self._describe = describe
        self._cfg = cfg
        # An older store has the pre-045 table: bring it up to date before the first
        # write (the audit writer applies its queue in order).
        audit.enqueue(observations.ensure_schema)

    def __repr__(self) -> str:
        return f"<ConsumerReads {self._audit!r}>"

    def _visible_actions(self) -> Collection[str] | None:
        """The actions whose observations the caller may read; None: every one."""
        seen = self._access.visible(self._access.caller())
        return None if seen is None else seen[1]

    async def directives(self, req: DirectiveListRequest) -> DirectiveList:
        view = await self._describe(CatalogDescribe(request_id=req.request_id))
        caller = self._access.caller()
        actions = [
            a
            for a in view.actions
            if caller.operator or granted(caller.grants, a.action_id, self._group_of(a.action_id))
        ]
        return DirectiveList(module_id=view.module_id, actions=actions)

    async def query(self, req: ObserveQuery) -> ObservationPage:
        page = observation_query.query(
            self._audit.read,
            req,
            max_page=self._cfg.max_page,
            actions=self._visible_actions(),
            now=rfc3339(),
        )
        return ObservationPage(
            observations=page.observations, next_cursor=page.next_cursor, limit=page.limit
        )

    async def get(self, req: ObservationGet) -> Observation:
        return observation_query.get(
            self._audit.read, req.observation_id, actions=self._visible_actions(), now=rfc3339()
        )

    async def topics(self, req: TopicSummaryRequest) -> TopicSummary:
        entries, truncated = observation_query.summary(
            self._audit.read,
            req,
            max_topics=self._cfg.max_page,
            actions=self._visible_actions(),
            now=rfc3339(),
        )
        return TopicSummary(topics=entries, truncated=truncated)

    def handlers(self) -> dict[type, Any]:
        return {
            DirectiveListRequest: self.directives,
            ObserveQuery: self.query,
            ObservationGet: self.get,
            TopicSummaryRequest: self.topics,
        }
