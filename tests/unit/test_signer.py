"""The scoped signer grant's parts: the catalog's checks of ``signing``, the signed
bytes, the grant table's bounds, the signer's keys and the helper without a grant."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import VerifyKey

from sensorium.connectors.os.catalog import sources as catalog
from sensorium.core.signer.grants import Grants, Refusal
from sensorium.core.signer.keys import SignerKeys, public_dir
from sensorium.shared.keys import node_key
from sensorium.shared.paths import StatePaths
from sensorium.shared.signer.protocol import PREFIX, signed_bytes, unb64url
from sensorium.shared.wire.declaration import SIGNING_MAX_SIGNATURES, Signing

GOOD = {
    "allowed_domains": ["git.commit.v1"],
    "key_ref": {"kind": "primary-participant"},
    "max_signatures": 1,
}


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    p = StatePaths(tmp_path / "state")
    p.ensure()
    return p


def _decl(action_id: str, **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "action_id": action_id,
        "class": "read-only-spawn",
        "executable": {"kind": "binary", "path": "/usr/bin/true", "argv_shape": ["true"]},
        "parameters_schema": {"type": "object", "properties": {}, "additionalProperties": False},
    }
    entry.update(fields)
    return entry


def _load(paths: StatePaths, *entries: dict[str, Any]) -> catalog.Catalog:
    catalog.materialize(paths)
    d = catalog.dropin_dir(paths)
    d.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "sensorium-os-config.v1", "action_catalog": list(entries)}
    (d / "50-test.json").write_text(json.dumps(doc))
    return catalog.load(paths)


# --- the catalog ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key_ref",
    [{"kind": "primary-participant"}, {"kind": "proxy"}, {"kind": "derived", "label": "ci"}],
)
def test_each_key_kind_loads(paths: StatePaths, key_ref: dict[str, Any]) -> None:
    cat = _load(paths, _decl("test.sign", signing={**GOOD, "key_ref": key_ref}))
    assert cat.valid, [str(p) for p in cat.problems]
    assert cat.declarations["test.sign"].signing is not None


BAD: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    ({"key_ref": {"kind": "hardware"}}, {}, "signing.key_ref.kind"),
    ({"key_ref": {}}, {}, "signing.key_ref.kind"),
    ({"key_ref": {"kind": "derived"}}, {}, "signing.key_ref.label"),
    ({"key_ref": {"kind": "proxy", "path": "/etc/shadow"}}, {}, "signing.key_ref.path"),
    ({"max_signatures": 0}, {}, "max_signatures"),
    ({"max_signatures": SIGNING_MAX_SIGNATURES + 1}, {}, "max_signatures"),
    ({"allowed_domains": []}, {}, "allowed_domains"),
    ({"allowed_domains": ["Git Commit"]}, {}, "allowed_domains"),
    ({}, {"execution_mode_support": "either"}, "execution_mode_support"),
]


@pytest.mark.parametrize(("signing", "extra", "where"), BAD)
def test_a_bad_signing_block_refuses_the_catalog(
    paths: StatePaths, signing: dict[str, Any], extra: dict[str, Any], where: str
) -> None:
    cat = _load(paths, _decl("test.sign", signing={**GOOD, **signing}, **extra))
    assert not cat.valid
    problems = [p for p in cat.problems if p.action_id == "test.sign"]
    assert any(where in f"{p.field} {p.message}" for p in problems), [str(p) for p in problems]


def test_every_bad_signing_block_is_in_one_report(paths: StatePaths) -> None:
    cat = _load(
        paths,
        _decl("test.one", signing={**GOOD, "key_ref": {"kind": "hsm"}}),
        _decl("test.two", signing={**GOOD, "key_ref": {"kind": "derived"}}),
    )
    assert {p.action_id for p in cat.problems} >= {"test.one", "test.two"}


# --- the signed bytes ---------------------------------------------------------------------


def test_signed_bytes_are_prefix_domain_and_raw_digest() -> None:
    digest = hashlib.sha256(b"payload").hexdigest()
    got = signed_bytes("git.commit.v1", digest)
    assert got == PREFIX + b"\x00git.commit.v1\x00" + bytes.fromhex(digest)
    assert signed_bytes("git.tag.v1", digest) != got
    for domain, d in (("nodots", digest), ("git.commit.v1", "ABC"), ("a.b\x00c", digest)):
        with pytest.raises(ValueError):
            signed_bytes(domain, d)


# --- the grant table ----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _signing(**over: Any) -> Signing:
    return Signing(**{**GOOD, **over})


def test_a_grant_signs_its_domains_up_to_its_count_then_ends() -> None:
    grants = Grants()
    token = grants.issue("d1", "test.sign", _signing(max_signatures=2), 60)
    digest = "0" * 64
    other = grants.admit(token, "git.tag.v1", digest, None)
    assert isinstance(other, Refusal) and other.code == "signer-domain-refused"
    for _ in range(2):
        got = grants.admit(token, "git.commit.v1", digest, None)
        assert not isinstance(got, Refusal)
    over = grants.admit(token, "git.commit.v1", digest, None)
    assert isinstance(over, Refusal) and over.code == "signer-count-exhausted"
    assert grants.end("d1") is not None
    ended = grants.admit(token, "git.commit.v1", digest, None)
    assert isinstance(ended, Refusal) and ended.code == "signer-grant-ended"
    assert ended.directive_id == "d1"
    assert grants.end("d1") is None


def test_a_grant_expires_with_its_deadline() -> None:
    clock = Clock()
    grants = Grants(clock)
    token = grants.issue("d1", "test.sign", _signing(), 5)
    clock.now += 6
    late = grants.admit(token, "git.commit.v1", "0" * 64, None)
    assert isinstance(late, Refusal) and late.code == "signer-grant-ended"
    assert not grants.live


def test_forged_and_foreign_tokens_are_refused() -> None:
    grants = Grants()
    mine = grants.issue("d1", "test.sign", _signing(), 60)
    theirs = grants.issue("d2", "test.sign", _signing(), 60)
    forged = grants.admit("x" * 43, "git.commit.v1", "0" * 64, None)
    assert isinstance(forged, Refusal) and forged.code == "signer-grant-unknown"
    got = grants.admit(mine, "git.commit.v1", "0" * 64, None)
    assert not isinstance(got, Refusal)
    bound, _grant = got
    foreign = grants.admit(theirs, "git.commit.v1", "0" * 64, bound)
    assert isinstance(foreign, Refusal) and foreign.code == "signer-grant-unknown"
    malformed = grants.admit(theirs, "git.commit.v1", "not-hex", None)
    assert isinstance(malformed, Refusal) and malformed.code == "request-malformed"


def test_one_grant_per_directive_at_a_time() -> None:
    grants = Grants()
    grants.issue("d1", "test.sign", _signing(), 60)
    with pytest.raises(Exception, match="already holds"):
        grants.issue("d1", "test.sign", _signing(), 60)


# --- the keys -----------------------------------------------------------------------------


def test_keys_by_kind_and_their_public_halves(paths: StatePaths) -> None:
    keys = SignerKeys(paths)
    node = node_key(paths)
    assert node is not None
    primary = keys.key_for({"kind": "primary-participant"})
    assert primary.key_id == node.key_id
    proxy = keys.key_for({"kind": "proxy"})
    assert proxy.key_id != node.key_id
    assert (paths.keys / "signer" / "proxy.key").stat().st_mode & 0o777 == 0o600
    ci = keys.key_for({"kind": "derived", "label": "ci"})
    assert SignerKeys(paths).key_for({"kind": "derived", "label": "ci"}).key_id == ci.key_id
    assert keys.key_for({"kind": "derived", "label": "other"}).key_id != ci.key_id
    published = {p.stem for p in public_dir(paths).glob("*.pub")}
    for pair in (primary, proxy, ci):
        assert pair.key_id.removeprefix("ed25519:") in published
        text = (public_dir(paths) / f"{pair.key_id.removeprefix('ed25519:')}.pub").read_text()
        assert VerifyKey(unb64url(text.strip())) == pair.verify_key
    with pytest.raises(ValueError):
        keys.key_for({"kind": "derived"})


# --- the helper -----------------------------------------------------------------------------


def test_the_helper_without_a_grant_says_so() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "sensorium.shared.signer.helper", "--domain", "git.commit.v1"],
        input=b"x",
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )
    assert res.returncode == 4
    assert b"signer-unavailable" in res.stderr
