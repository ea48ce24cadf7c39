"""The ``action_id`` → declaration map, built only from the connector's module report."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sensorium.shared.wire.report import RUNNABLE_STATES, ConnectorAction, ModuleReport

if TYPE_CHECKING:
    import jsonschema
    from jsonschema.exceptions import ValidationError

MAX_REPORTED_ERRORS = 10
_REQUIRED = re.compile(r"^(['\"])(.*)\1 is a required property$")


@dataclass(frozen=True)
class ParameterError:
    path: str
    message: str


@dataclass(frozen=True)
class Resolved:
    action: ConnectorAction

    @property
    def runnable(self) -> bool:
        return self.action.state in RUNNABLE_STATES

    @cached_property
    def validator(self) -> jsonschema.protocols.Validator:
        """Compiled on first use: jsonschema is a tenth of a second of imports that a
        restarting core need not pay before it answers (``warm`` loads it once ready)."""
        return parameters_validator(self.action.parameters_schema)

    def check(self, parameters: dict[str, Any]) -> list[ParameterError]:
        """Every failing location, most specific first, each with a ``$.parameters`` path."""
        errors = sorted(
            self.validator.iter_errors(parameters),
            key=lambda e: (list(map(str, e.absolute_path)), e.message),
        )
        return [ParameterError(_json_path(e), e.message) for e in errors[:MAX_REPORTED_ERRORS]]


def parameters_validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """Core's validator of an action's parameters: always 2020-12, as the catalog was
    checked at load; formats are enforced, and every pattern is matched in linear time
    (never Python's re)."""
    from sensorium.shared import schemapatterns

    return schemapatterns.parameters_validator(schema)


def _json_path(err: ValidationError) -> str:
    path = "$.parameters"
    for part in err.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    # A missing required property names its parent; point at the property itself.
    if err.validator == "required":
        # jsonschema reports each missing property as its own error, named only in the text.
        m = _REQUIRED.match(err.message)
        if m:
            path += f".{m.group(2)}"
    return path


def warm() -> None:
    """Load the parameter validators' code (jsonschema): called off the loop once core
    is ready, so that neither the start nor the first directive waits for it."""
    from sensorium.shared import schemapatterns  # noqa: F401


class ResolutionMap:
    """What core knows of the connector's catalog, from its latest report."""

    def __init__(self) -> None:
        self.report: ModuleReport | None = None
        self.actions: dict[str, Resolved] = {}

    def __repr__(self) -> str:
        inst = self.report.instance_id if self.report else None
        return f"<ResolutionMap connector={inst} actions={len(self.actions)}>"

    def load(self, report: ModuleReport) -> None:
        actions: dict[str, Resolved] = {}
        if report.catalog_exposed:
            for action in report.connector_actions:
                actions[action.action_id] = Resolved(action)
        # Swap whole: a directive never sees half of one report and half of another.
        self.report, self.actions = report, actions

    def clear(self) -> None:
        self.report, self.actions = None, {}

    def get(self, action_id: str) -> Resolved | None:
        return self.actions.get(action_id)
