"""The ``action_id`` → declaration map, built only from the connector's module report."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError

from sensorium.shared.schemapatterns import parameters_validator
from sensorium.shared.wire.report import RUNNABLE_STATES, ConnectorAction, ModuleReport

MAX_REPORTED_ERRORS = 10
_REQUIRED = re.compile(r"^(['\"])(.*)\1 is a required property$")


@dataclass(frozen=True)
class ParameterError:
    path: str
    message: str


@dataclass(frozen=True)
class Resolved:
    action: ConnectorAction
    validator: jsonschema.protocols.Validator

    @property
    def runnable(self) -> bool:
        return self.action.state in RUNNABLE_STATES

    def check(self, parameters: dict[str, Any]) -> list[ParameterError]:
        """Every failing location, most specific first, each with a ``$.parameters`` path."""
        errors = sorted(
            self.validator.iter_errors(parameters),
            key=lambda e: (list(map(str, e.absolute_path)), e.message),
        )
        return [ParameterError(_json_path(e), e.message) for e in errors[:MAX_REPORTED_ERRORS]]


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
                # Always 2020-12, as the catalog was checked at load; formats are enforced,
                # and every pattern is matched in linear time (never Python's re).
                validator = parameters_validator(action.parameters_schema)
                actions[action.action_id] = Resolved(action, validator)
        # Swap whole: a directive never sees half of one report and half of another.
        self.report, self.actions = report, actions

    def clear(self) -> None:
        self.report, self.actions = None, {}

    def get(self, action_id: str) -> Resolved | None:
        return self.actions.get(action_id)
