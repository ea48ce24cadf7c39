"""The scoped signer grant's parts: the catalog's checks of ``signing``, the signed
bytes, the grant table's bounds, the signer's channels (a real socket and audit store),
the signer's keys and the helper without a grant."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import VerifyKey

from sensorium.connectors.os.catalog import sources as catalog
from sensorium.core.audit import AuditStore
from sensorium.core.signer.grants import Grants, Refusal
from sensorium.core.signer.keys import SignerKeys, public_dir
from sensorium.core.signer.server import MAX_REFUSALS, Signer
from sensorium.shared.keys import node_key
from sensorium.shared.paths import StatePaths
from sensorium.shared.signer.protocol import (
    PREFIX,
    signed_bytes,
    unb64url,
    valid_digest,
    valid_domain,
)
from sensorium.shared.wire.declaration import SIGNING_MAX_SIGNATURES, Signing
from sensorium.shared.wire.outcome import Outcome

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
    ({"allowed_domains": ["git.commit.v1\n"]}, {}, "allowed_domains"),
    ({"key_ref": {"kind": "derived", "label": "ci\n"}}, {}, "signing.key_ref.label"),
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
    for domain, d in (
        ("nodots", digest),
        ("git.commit.v1", "ABC"),
        ("a.b\x00c", digest),
        ("git.commit.v1\n", digest),
        ("git.commit.v1", digest + "\n"),
    ):
        with pytest.raises(ValueError):
            signed_bytes(domain, d)


def test_a_trailing_newline_is_no_part_of_a_domain_or_digest() -> None:
    digest = hashlib.sha256(b"payload").hexdigest()
    assert valid_domain("git.commit.v1") and valid_digest(digest)
    assert not valid_domain("git.commit.v1\n")
    assert not valid_digest(digest + "\n")


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
    token = grants.issue("g1", "d1", "test.sign", _signing(max_signatures=2), 60)
    digest = "0" * 64
    other = grants.admit(token, "git.tag.v1", digest, None)
    assert isinstance(other, Refusal) and other.code == "signer-domain-refused"
    for _ in range(2):
        got = grants.admit(token, "git.commit.v1", digest, None)
        assert not isinstance(got, Refusal)
    over = grants.admit(token, "git.commit.v1", digest, None)
    assert isinstance(over, Refusal) and over.code == "signer-count-exhausted"
    assert grants.end("g1") is not None
    ended = grants.admit(token, "git.commit.v1", digest, None)
    assert isinstance(ended, Refusal) and ended.code == "signer-grant-ended"
    assert ended.directive_id == "d1"
    assert grants.end("g1") is None


def test_a_grant_past_its_deadline_refuses_but_only_its_dispatch_ends_it() -> None:
    clock = Clock()
    grants = Grants(clock)
    token = grants.issue("g1", "d1", "test.sign", _signing(max_signatures=2), 5)
    got = grants.admit(token, "git.commit.v1", "0" * 64, None)
    assert not isinstance(got, Refusal)
    clock.now += 6
    late = grants.admit(token, "git.commit.v1", "0" * 64, None)
    assert isinstance(late, Refusal) and late.code == "signer-grant-ended"
    assert late.directive_id == "d1"
    # Still there for its dispatch's end: that is what audits it and what it gave.
    assert grants.live
    ended = grants.end("g1")
    assert ended is not None and ended[1].remaining == 1
    assert not grants.live


def test_forged_and_foreign_tokens_are_refused() -> None:
    grants = Grants()
    mine = grants.issue("g1", "d1", "test.sign", _signing(), 60)
    theirs = grants.issue("g2", "d2", "test.sign", _signing(), 60)
    forged = grants.admit("x" * 43, "git.commit.v1", "0" * 64, None)
    assert isinstance(forged, Refusal) and forged.code == "signer-grant-unknown"
    got = grants.admit(mine, "git.commit.v1", "0" * 64, None)
    assert not isinstance(got, Refusal)
    bound, _grant = got
    foreign = grants.admit(theirs, "git.commit.v1", "0" * 64, bound)
    assert isinstance(foreign, Refusal) and foreign.code == "signer-grant-unknown"
    malformed = grants.admit(theirs, "git.commit.v1", "not-hex", None)
    assert isinstance(malformed, Refusal) and malformed.code == "request-malformed"


def test_grants_are_per_dispatch_so_a_colliding_directive_id_blocks_nothing() -> None:
    grants = Grants()
    first = grants.issue("g1", "d1", "test.sign", _signing(), 60)
    # Another caller's directive with the same id, dispatched under its own seam request.
    second = grants.issue("g2", "d1", "test.sign", _signing(), 60)
    assert first != second and len(grants.live) == 2
    with pytest.raises(Exception, match="already holds"):
        grants.issue("g1", "d1", "test.sign", _signing(), 60)
    assert grants.end("g1") is not None
    got = grants.admit(second, "git.commit.v1", "0" * 64, None)
    assert not isinstance(got, Refusal)


# --- the signer's channels ------------------------------------------------------------------

DIGEST = "0" * 64


def _line(**req: Any) -> bytes:
    return json.dumps(req).encode() + b"\n"


def _request(token: object, domain: object = "git.commit.v1", digest: object = DIGEST) -> bytes:
    return _line(token=token, domain=domain, **{"payload/sha256": digest})


def _rows(audit: AuditStore) -> list[tuple[str, str | None]]:
    return [
        (str(k), c) for k, c in audit.read("SELECT kind, code FROM signer_events ORDER BY rowid")
    ]


def _serve(paths: StatePaths, body: Any) -> Any:
    """``body(signer, audit)`` against a started signer on its real socket."""

    async def run() -> Any:
        audit = AuditStore(paths.audit_db)
        signer = Signer(paths, audit)
        try:
            await signer.start()
            return await body(signer, audit)
        finally:
            signer.close()
            await audit.settled()
            audit.close()

    return asyncio.run(run())


async def _replies(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> list[dict[str, Any]]:
    """Every reply until the signer closes the channel (a hang guard, not a timing)."""
    try:
        data = await asyncio.wait_for(reader.read(), 60)
    except ConnectionError:  # closed with our lines still unread
        data = b""
    writer.close()
    return [json.loads(x) for x in data.splitlines()]


@pytest.mark.parametrize("bound", [False, True], ids=["unbound", "bound"])
def test_a_channel_is_closed_after_its_refusals_with_one_record_of_it(
    paths: StatePaths, bound: bool
) -> None:
    bad = [
        _request("forged" + "A" * 40),
        b"not json\n",
        _request(None),
        _line(token="x", domain=["a"]),
    ]

    async def body(signer: Signer, audit: AuditStore) -> None:
        token = signer.issue("g1", "d1", "test.sign", _signing(), 60)
        reader, writer = await asyncio.open_unix_connection(str(signer.path))
        if bound:
            writer.write(_line(bind=token))
            bad[0] = _request(token, domain="git.tag.v1")  # its own grant, wrong domain
        # An action sending a thousand bad lines in one go.
        writer.write(b"".join(bad[i % len(bad)] for i in range(1000)))
        try:
            await writer.drain()
        except ConnectionError:
            pass
        replies = await _replies(reader, writer)
        assert len(replies) <= MAX_REFUSALS, replies
        assert all(r["ok"] is False for r in replies)
        await audit.settled()
        kinds = [k for k, _code in _rows(audit)]
        assert kinds.count("refused") == MAX_REFUSALS
        assert kinds.count("closed") == 1
        assert len(kinds) <= 1 + MAX_REFUSALS + 1  # issued, the refusals, closed
        assert not signer._channels
        # The grant itself is untouched: its own channel would still be answered.
        assert signer.grants.live

    _serve(paths, body)


def test_a_bound_channel_is_closed_when_its_grant_ends_though_never_used(
    paths: StatePaths,
) -> None:
    async def body(signer: Signer, audit: AuditStore) -> None:
        token = signer.issue("g1", "d1", "test.sign", _signing(), 60)
        reader, writer = await asyncio.open_unix_connection(str(signer.path))
        writer.write(_line(bind=token))
        await writer.drain()
        for _ in range(10_000):  # the signer reads the bind line on a later turn
            if any(c.bound for c in signer._channels.values()):
                break
            await asyncio.sleep(0)
        assert any(c.bound for c in signer._channels.values())
        signer.end("g1")
        assert await _replies(reader, writer) == []
        # A bind naming a grant that has ended closes the channel at once.
        reader, writer = await asyncio.open_unix_connection(str(signer.path))
        writer.write(_line(bind=token) + _request(token))
        await writer.drain()
        assert await _replies(reader, writer) == []

    _serve(paths, body)


def test_an_unbound_channel_is_bound_by_the_first_token_it_presents(paths: StatePaths) -> None:
    async def body(signer: Signer, audit: AuditStore) -> None:
        live = signer.issue("g1", "d1", "test.sign", _signing(), 60)
        reader, writer = await asyncio.open_unix_connection(str(signer.path))
        writer.write(_request("guess" + "A" * 40))
        writer.write(_request(live))
        await writer.drain()
        first = json.loads(await reader.readline())
        second = json.loads(await reader.readline())
        assert first["code"] == second["code"] == "signer-grant-unknown"
        assert "another grant" in second["message"]
        writer.close()
        assert not signer.grants.live[next(iter(signer.grants.live))].given

    _serve(paths, body)


def test_an_expired_grant_still_ends_with_its_record_and_its_signatures(
    paths: StatePaths,
) -> None:
    clock = Clock()

    async def body(signer: Signer, audit: AuditStore) -> Outcome | None:
        signer.grants = Grants(clock)
        token = signer.issue("g1", "d1", "test.sign", _signing(max_signatures=2), 5)
        reader, writer = await asyncio.open_unix_connection(str(signer.path))
        writer.write(_line(bind=token) + _request(token))
        await writer.drain()
        assert json.loads(await reader.readline())["ok"] is True
        clock.now += 6
        writer.write(_request(token))
        await writer.drain()
        assert json.loads(await reader.readline())["code"] == "signer-grant-ended"
        outcome = Outcome(
            outcome_id="o1",
            directive_id="d1",
            action_id="test.sign",
            status="completed",
            started_at="2026-05-05T18:00:00.000Z",
            duration_ms=1.0,
            timeout_ms=1000,
        )
        ended = signer.end("g1", outcome)
        assert await _replies(reader, writer) == []
        await audit.settled()
        assert [k for k, _code in _rows(audit)] == ["issued", "signed", "refused", "ended"]
        return ended

    ended = _serve(paths, body)
    assert ended is not None
    assert [s.domain for s in ended.signatures] == ["git.commit.v1"]


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
