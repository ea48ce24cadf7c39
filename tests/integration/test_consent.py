"""Core's consent policy on a real node: an action above what a caller may trigger
without consent is refused before dispatch (``consent-required``, audited, nothing
ran) unless the directive consents to its sensitivity; the CLI's ``--consent``."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
from harness import Stack, python_action, running_stack

from sensorium.client.errors import ConsentRequired

# Prints its JSON argument: a run leaves an observation of its declared sensitivity.
PERSONAL = python_action(
    "test.personal",
    "emit.py",
    ["{{text}}"],
    {"text": {"type": "string"}},
    result_contract={"stdout_format": "json", "signal_kind": "test.personal/seen"},
    sensitivity={"class": "sensitive-personal"},
)
PLAIN = python_action("test.plain", "emit.py", ["{{text}}"], {"text": {"type": "string"}})


@pytest.fixture(scope="module")
def node() -> Iterator[Stack]:
    with running_stack([PERSONAL, PLAIN]) as s:
        yield s


def test_without_consent_a_sensitive_personal_action_is_refused_before_dispatch(
    node: Stack,
) -> None:
    with node.client() as c:
        with pytest.raises(ConsentRequired) as err:
            c.invoke("test.personal", {"text": '{"a": 1}'})
        assert err.value.code == "consent-required"
        assert err.value.detail["sensitivity"] == "sensitive-personal"
        assert err.value.detail["allowed"] == "private"
        rec = c.audit_get(err.value.detail["outcome/id"])
        assert rec.status == "rejected" and rec.retry_attempts == 0
        assert [d.code for d in rec.diagnostics] == ["consent-required"]
        assert rec.connector_dispatched_at is msgspec.UNSET  # nothing was dispatched
        # An action at or below the threshold runs as before.
        assert c.invoke("test.plain", {"text": "{}"}).status == "completed"


def test_consent_to_its_class_lets_it_run_and_its_observation_says_so(node: Stack) -> None:
    with node.client() as c:
        out = c.invoke("test.personal", {"text": '{"a": 1}'}, consent="sensitive-personal")
        assert out.status == "completed", (out.stderr.text, out.diagnostics)
        [obs] = c.observe_query(signal_kind="test.personal/seen").observations
    assert obs.sensitivity.class_ == "sensitive-personal"
    assert obs.incidental_effects == ["disk-access-timestamp-update"]


def test_the_cli_consents_with_a_flag(node: Stack) -> None:
    refused = node.cli("invoke", "test.personal", "-p", "text={}")
    assert refused.returncode != 0 and "consent-required" in refused.stderr, refused.stderr
    ran = node.cli("invoke", "test.personal", "-p", "text={}", "--consent", "sensitive-personal")
    assert ran.returncode == 0, ran.stderr
