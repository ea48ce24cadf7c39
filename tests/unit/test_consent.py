"""Each class's baselines (C6 composed from its categories') and core's consent policy.

Seed 048: an outcome and an observation declare at least the class's baseline
incidental effects; an observation's sensitivity is at least the class's baseline;
C6's effects are the union of its named categories' baselines and its sensitivity
the strictest of theirs. Core applies the sensitivity/consent policy before dispatch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from sensorium.client.errors import ConsentRequired, from_coded
from sensorium.connectors.os.run.results import build_outcome
from sensorium.connectors.os.run.spawning import Capture, SpawnResult
from sensorium.core import observations
from sensorium.core.consent import action_sensitivity, check_consent
from sensorium.shared import sensitivity
from sensorium.shared.config import ConfigError, ConsentConfig, NodeConfig, load_node_config
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePaths
from sensorium.shared.sensitivity import (
    baseline_effects,
    baseline_sensitivity,
    effective_sensitivity,
    strictest,
)
from sensorium.shared.wire.declaration import SENSITIVITY_CLASSES, Declaration, ResultContract
from sensorium.shared.wire.directive import Directive, Issuer, new_directive
from sensorium.shared.wire.report import ConnectorAction

ISSUER = Issuer(module_id="sensorium.tests")


def _action(cls: str = "read-only-spawn", **fields: Any) -> ConnectorAction:
    return ConnectorAction(
        action_id="test.act",
        class_=cls,  # type: ignore[arg-type]
        parameters_schema={"type": "object"},
        default_timeout_ms=1000,
        max_timeout_ms=2000,
        result_contract=ResultContract(signal_kind="test.obs/done"),
        state="enabled",
        **fields,
    )


def _directive(consent: str | None = None) -> Directive:
    return new_directive("test.act", {}, issuer=ISSUER, consent=consent)  # type: ignore[arg-type]


# --- baselines ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "effects"),
    [
        ("read-only-spawn", ["disk-access-timestamp-update"]),
        ("allowlisted-script", ["disk-access-timestamp-update"]),
        ("scoped-fs-write", ["disk-access-timestamp-update", "local-filesystem-write"]),
        ("egress-network-spawn", ["network-egress"]),
        ("artifact-producing-spawn", ["disk-access-timestamp-update", "artifact-lane-write"]),
    ],
)
def test_each_class_has_the_seeds_baselines(cls: str, effects: list[str]) -> None:
    assert baseline_effects(cls) == effects
    assert baseline_sensitivity(cls) == "operational-sensitive"


def test_c6_effects_are_the_union_of_its_named_categories_baselines() -> None:
    assert baseline_effects("composed-spawn", ["egress-network"]) == ["network-egress"]
    assert baseline_effects("composed-spawn", ["read", "egress-network", "artifact-produce"]) == [
        "disk-access-timestamp-update",
        "network-egress",
        "artifact-lane-write",
    ]
    assert baseline_sensitivity("composed-spawn", ["read", "scoped-fs-write"]) == (
        "operational-sensitive"
    )


def test_c6_sensitivity_is_the_strictest_of_its_categories(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Today every class's baseline is the same; a stricter one must win in C6."""
    monkeypatch.setitem(sensitivity.CLASS_SENSITIVITY, "egress-network-spawn", "private")
    assert baseline_sensitivity("composed-spawn", ["read", "egress-network"]) == "private"
    assert baseline_sensitivity("composed-spawn", ["read", "artifact-produce"]) == (
        "operational-sensitive"
    )


def test_a_class_without_a_baseline_fails_closed() -> None:
    assert baseline_sensitivity("operator-gated-spawn") == "sensitive-personal"
    assert baseline_sensitivity("composed-spawn", []) == "sensitive-personal"
    assert baseline_effects("operator-gated-spawn") == []
    assert strictest([]) == "sensitive-personal"


def test_a_declaration_raises_the_sensitivity_never_lowers_it() -> None:
    assert effective_sensitivity("read-only-spawn", (), "public") == "operational-sensitive"
    assert effective_sensitivity("read-only-spawn", (), "private") == "private"
    assert effective_sensitivity("read-only-spawn", (), "made-up") == "operational-sensitive"
    assert effective_sensitivity("read-only-spawn", (), None) == "operational-sensitive"


def _declaration(**fields: Any) -> Declaration:
    doc = {
        "action_id": "test.act",
        "class": "read-only-spawn",
        "executable": {"kind": "binary", "path": "/usr/bin/true", "argv_shape": ["true"]},
        "parameters_schema": {"type": "object"},
        **fields,
    }
    return msgspec.convert(doc, type=Declaration, from_attributes=False)


def _ran() -> SpawnResult:
    return SpawnResult(
        pid=1,
        exit_code=0,
        signal=None,
        timed_out=False,
        stdout=Capture(cap=16),
        stderr=Capture(cap=16),
        started_at=1_700_000_000.0,
        duration_s=0.01,
    )


def test_a_c6_outcome_declares_the_union_and_what_the_declaration_adds() -> None:
    decl = _declaration(
        **{"class": "composed-spawn"},
        composed={"effects": ["read", "egress-network"]},
        egress_network={
            "endpoints": [{"host": "a.example", "port": 443, "protocol": "https"}],
            "max_bytes_total": 10,
            "max_bytes_per_connection": 10,
        },
        connector_incidental_effects=["network-egress", "clock-read"],
    )
    out = build_outcome(
        outcome_id="o1",
        directive=_directive(),
        decl=decl,
        argv=["true"],
        timeout_ms=1000,
        run=_ran(),
        unauthorized=False,
    )
    assert out.incidental_effects == [
        "disk-access-timestamp-update",
        "network-egress",
        "clock-read",
    ]
    assert out.sensitivity.class_ == "operational-sensitive"
    # The observation carries them too, at no less than the class's sensitivity.
    action = _action("composed-spawn", composed_effects=["read", "egress-network"])
    [obs] = observations.build(out, action, "sensorium-os")
    assert obs.incidental_effects == out.incidental_effects
    assert obs.sensitivity.class_ == "operational-sensitive"
    doc = msgspec.to_builtins(obs)
    assert doc["incidental/effects"] == out.incidental_effects


def test_an_observation_is_never_below_its_class_baseline() -> None:
    decl = _declaration()
    out = build_outcome(
        outcome_id="o1",
        directive=_directive(),
        decl=decl,
        argv=["true"],
        timeout_ms=1000,
        run=_ran(),
        unauthorized=False,
    )
    # A connector that claimed less (an older one) is raised to the class's baseline.
    lowered = msgspec.structs.replace(
        out, sensitivity=msgspec.structs.replace(out.sensitivity, class_="public")
    )
    [obs] = observations.build(lowered, _action(), "sensorium-os")
    assert obs.sensitivity.class_ == "operational-sensitive"


# --- consent before dispatch --------------------------------------------------------------


def test_the_default_lets_every_class_but_sensitive_personal_run_without_consent() -> None:
    assert NodeConfig().consent.max_sensitivity_without_consent == "private"
    for declared in (None, "public", "community", "operational-sensitive", "private"):
        check_consent(_directive(), _action(sensitivity_class=declared), ConsentConfig())


def test_above_the_threshold_without_consent_is_refused_with_a_stable_code() -> None:
    action = _action(sensitivity_class="sensitive-personal")
    with pytest.raises(CodedError) as caught:
        check_consent(_directive(), action, ConsentConfig())
    err = caught.value
    assert err.code == RuntimeErrorCode.CONSENT_REQUIRED == "consent-required"
    assert err.path == "$.consent/sensitivity"
    assert err.detail == {"sensitivity": "sensitive-personal", "allowed": "private"}
    assert "no consent was given" in err.message
    assert isinstance(from_coded(err), ConsentRequired)


def test_consent_at_or_above_the_actions_class_lets_it_run() -> None:
    action = _action(sensitivity_class="sensitive-personal")
    check_consent(_directive("sensitive-personal"), action, ConsentConfig())


def test_consent_to_a_laxer_class_is_not_consent() -> None:
    action = _action(sensitivity_class="sensitive-personal")
    with pytest.raises(CodedError, match="consent/sensitivity 'private' does not reach it"):
        check_consent(_directive("private"), action, ConsentConfig())


def test_the_operator_threshold_decides_and_c6_ranks_by_what_it_composes() -> None:
    strict = ConsentConfig(max_sensitivity_without_consent="community")
    composed = _action("composed-spawn", composed_effects=["read", "egress-network"])
    assert action_sensitivity(composed) == "operational-sensitive"
    with pytest.raises(CodedError) as caught:
        check_consent(_directive(), composed, strict)
    assert caught.value.detail["sensitivity"] == "operational-sensitive"
    check_consent(_directive("operational-sensitive"), composed, strict)
    lax = ConsentConfig(max_sensitivity_without_consent=SENSITIVITY_CLASSES[-1])
    check_consent(_directive(), _action(sensitivity_class="sensitive-personal"), lax)


def test_the_threshold_is_one_of_the_published_classes(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.node_config.parent.mkdir(parents=True, exist_ok=True)
    paths.node_config.write_text('{"consent": {"max_sensitivity_without_consent": "public"}}')
    assert load_node_config(paths).consent.max_sensitivity_without_consent == "public"
    paths.node_config.write_text('{"consent": {"max_sensitivity_without_consent": "secret"}}')
    with pytest.raises(ConfigError, match="consent"):
        load_node_config(paths)


def test_consent_travels_in_the_directive_as_a_project_field() -> None:
    d = _directive("private")
    doc = msgspec.json.decode(msgspec.json.encode(d))
    assert doc["consent/sensitivity"] == "private"
    assert "consent/sensitivity" not in msgspec.json.decode(msgspec.json.encode(_directive()))
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(
            msgspec.json.encode({**doc, "consent/sensitivity": "secret"}), type=Directive
        )
