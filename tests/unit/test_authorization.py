"""Catalog authorization: the sidecar, the three postures, the attacks, per-dispatch checks.

Contract: seed 048 "Operator Authorization via Sidecar Signature" and issue 3.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import stat
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import rfc8785
from nacl.signing import VerifyKey

from sensorium.connectors.os.catalog import authorization as authz
from sensorium.connectors.os.catalog import sources as catalog
from sensorium.connectors.os.catalog.authorization import (
    Authorizer,
    Verdict,
    bootstrap,
    fingerprint,
    sidecar_path,
    sign,
    sign_catalog,
    signed_config,
    signed_snapshot_path,
    verify,
    write_sidecar,
)
from sensorium.connectors.os.catalog.sources import Catalog
from sensorium.shared.config import NodeConfig, load_node_config
from sensorium.shared.keys import KeyPair, b64url, new_operator_key, node_id, node_key, unb64url
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.signature import ConfigSignature, SignatureValue, Signer

ALICE = "did:example:alice"
BOB = "did:example:bob"


# --- helpers -------------------------------------------------------------------------


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    p = StatePaths(tmp_path / "state")
    p.ensure()
    return p


def _decl(action_id: str = "test.echo") -> dict[str, Any]:
    return {
        "action_id": action_id,
        "class": "read-only-spawn",
        "executable": {"kind": "binary", "path": "/usr/bin/true", "argv_shape": ["true"]},
        "parameters_schema": {"type": "object", "properties": {}, "additionalProperties": False},
    }


def _dropin(
    paths: StatePaths, action_id: str = "test.echo", name: str = "50-test.json", **top: Any
) -> Path:
    """Write a drop-in declaring one action (plus any top-level fields)."""
    d = catalog.dropin_dir(paths)
    d.mkdir(parents=True, exist_ok=True)
    path = d / name
    doc = {"schema": "sensorium-os-config.v1", "action_catalog": [_decl(action_id)], **top}
    path.write_text(json.dumps(doc))
    return path


def _load(paths: StatePaths) -> Catalog:
    cat = catalog.load(paths)
    assert cat.valid, cat.problems
    return cat


def _operator(paths: StatePaths, participant: str = ALICE) -> KeyPair:
    return new_operator_key(paths, participant)[0]


def _trust(paths: StatePaths, *entries: tuple[str, KeyPair]) -> NodeConfig:
    """Write config/node.json trusting each (participant/id, key) and return it loaded."""
    signers = [
        {"participant/id": who, "key/id": pair.key_id, "public_key": pair.public_key}
        for who, pair in entries
    ]
    paths.node_config.write_text(json.dumps({"trusted_signers": signers}))
    return load_node_config(paths)


def _op_signer(pair: KeyPair) -> Signer:
    assert pair.participant_id is not None
    return Signer(participant_id=pair.participant_id, key_id=pair.key_id)


def _sign_as(paths: StatePaths, pair: KeyPair, cat: Catalog) -> ConfigSignature:
    """The operator's act: sign the effective configuration and write the sidecar."""
    sidecar = sign(cat.config_hash, pair, _op_signer(pair))
    write_sidecar(paths, sidecar, cat.config)
    return sidecar


def _put_sidecar(paths: StatePaths, sidecar: ConfigSignature) -> None:
    """Write a (possibly forged) sidecar verbatim, bypassing write_sidecar."""
    sidecar_path(paths).write_bytes(msgspec.json.encode(sidecar))


def _other_hash() -> str:
    """The hash of a configuration other than the running one (computed, not installed)."""
    extra = msgspec.json.encode({"action_catalog": [_decl("test.other")]})
    return catalog.merge([("a", catalog.factory_text()), ("b", extra)], []).config_hash


@pytest.fixture
def signed(paths: StatePaths) -> tuple[Catalog, KeyPair, NodeConfig]:
    """Started once (node-signed), then edited with a drop-in and signed by trusted Alice."""
    bootstrap(paths, NodeConfig(), _load(paths))
    _dropin(paths)
    cat = _load(paths)
    alice = _operator(paths)
    cfg = _trust(paths, (ALICE, alice))
    _sign_as(paths, alice, cat)
    assert verify(paths, cfg, cat.config_hash).reason == "ok"
    return cat, alice, cfg


# --- host bootstrap --------------------------------------------------------------------


def test_first_start_node_signs_the_pristine_factory_catalog(paths: StatePaths) -> None:
    cat = _load(paths)
    assert cat.materialized and cat.pristine
    verdict, did_sign = bootstrap(paths, NodeConfig(), cat)
    assert did_sign
    assert verdict.authorized and verdict.reason == "ok"
    assert verdict.signer is not None
    assert verdict.signer.participant_id is None
    node = node_key(paths, create=False)
    assert node is not None
    assert verdict.signer.node_id == node_id(node)
    assert verdict.signer.key_id == node.key_id
    assert sidecar_path(paths) == paths.root / "config" / ".signatures" / "sensorium-os.sig.json"
    assert sidecar_path(paths).is_file()


def test_node_signed_sidecar_names_signer_node_id_as_seed_048_does(paths: StatePaths) -> None:
    bootstrap(paths, NodeConfig(), _load(paths))
    signer = json.loads(sidecar_path(paths).read_text())["signer"]
    node = node_key(paths, create=False)
    assert node is not None
    assert signer == {"node_id": node_id(node), "key/id": node.key_id}


def test_a_sidecar_of_the_earlier_shape_node_slash_id_still_verifies(paths: StatePaths) -> None:
    cat = _load(paths)
    node = node_key(paths, create=True)
    assert node is not None
    # What earlier versions wrote: the signer spelled {"node/id", "key/id"}, signed so
    # in the wrapper form (the one that binds the signer).
    legacy = Signer(legacy_node_id=node_id(node), key_id=node.key_id)
    _put_sidecar(paths, sign(cat.config_hash, node, legacy, "sensorium-wrapper.v1"))
    assert "node/id" in json.loads(sidecar_path(paths).read_text())["signer"]
    verdict = verify(paths, NodeConfig(), cat.config_hash)
    assert verdict.authorized and verdict.reason == "ok"
    assert verdict.signer == Signer(node_id=node_id(node), key_id=node.key_id)
    # ... and its signature binds that spelling: the same bytes relabelled do not pass.
    doc = json.loads(sidecar_path(paths).read_text())
    doc["signer"] = {"node_id": node_id(node), "key/id": node.key_id}
    sidecar_path(paths).write_text(json.dumps(doc))
    assert verify(paths, NodeConfig(), cat.config_hash).reason == "signature-invalid"


def test_node_key_file_is_mode_0600(paths: StatePaths) -> None:
    bootstrap(paths, NodeConfig(), _load(paths))
    mode = stat.S_IMODE((paths.keys / "node.key").stat().st_mode)
    assert mode == 0o600


def test_second_start_does_not_resign_and_verifies_ok(paths: StatePaths) -> None:
    bootstrap(paths, NodeConfig(), _load(paths))
    before = sidecar_path(paths).read_bytes()
    mtime = sidecar_path(paths).stat().st_mtime_ns
    cat = _load(paths)
    assert not cat.materialized
    verdict, did_sign = bootstrap(paths, NodeConfig(), cat)
    assert not did_sign
    assert verdict.reason == "ok"
    assert sidecar_path(paths).read_bytes() == before
    assert sidecar_path(paths).stat().st_mtime_ns == mtime


def test_operator_edit_makes_node_signature_stale_and_bootstrap_keeps_it(
    paths: StatePaths,
) -> None:
    bootstrap(paths, NodeConfig(), _load(paths))
    before = sidecar_path(paths).read_bytes()
    _dropin(paths)
    cat = _load(paths)
    assert verify(paths, NodeConfig(), cat.config_hash).reason == "hash-mismatch"
    verdict, did_sign = bootstrap(paths, NodeConfig(), cat)
    assert not did_sign and verdict.reason == "hash-mismatch"
    assert sidecar_path(paths).read_bytes() == before


def test_bootstrap_never_replaces_a_stale_sidecar_even_on_a_fresh_pristine_state(
    paths: StatePaths,
) -> None:
    # A stale sidecar (over another config) is present; the operator file and drop-ins are
    # gone, so this start materializes pristine factory defaults again.
    bootstrap(paths, NodeConfig(), _load(paths))
    node = node_key(paths, create=False)
    assert node is not None
    _put_sidecar(paths, sign(_other_hash(), node, authz.node_signer(node)))
    before = sidecar_path(paths).read_bytes()
    catalog.operator_file(paths).unlink()
    cat = _load(paths)
    assert cat.materialized and cat.pristine
    verdict, did_sign = bootstrap(paths, NodeConfig(), cat)
    assert not did_sign
    assert verdict.reason == "hash-mismatch" and not verdict.exposed
    assert sidecar_path(paths).read_bytes() == before


def test_absent_sidecar_on_non_pristine_first_start_is_missing_not_node_signed(
    paths: StatePaths,
) -> None:
    _dropin(paths)  # before the first load: materialized, but not pristine
    cat = _load(paths)
    assert cat.materialized and not cat.pristine
    verdict, did_sign = bootstrap(paths, NodeConfig(), cat)
    assert not did_sign
    assert verdict.reason == "missing" and not verdict.exposed
    assert not sidecar_path(paths).exists()


def test_allow_unsigned_bootstrap_tolerates_a_missing_sidecar_unauthorized(
    paths: StatePaths,
) -> None:
    _dropin(paths, allow_unsigned_bootstrap=True)
    cat = _load(paths)
    assert cat.allow_unsigned_bootstrap
    verdict, did_sign = bootstrap(paths, NodeConfig(), cat)
    assert not did_sign
    # The seed's reason stays "missing"; the posture only tolerates it, loudly.
    assert verdict.reason == "missing" and verdict.tolerated
    assert verdict.exposed and not verdict.authorized
    assert not sidecar_path(paths).exists()


@pytest.mark.parametrize("damage", ["stale", "corrupt"])
def test_allow_unsigned_bootstrap_does_not_excuse_a_present_bad_sidecar(
    paths: StatePaths, damage: str
) -> None:
    bootstrap(paths, NodeConfig(), _load(paths))  # node-signed, then edited
    _dropin(paths, allow_unsigned_bootstrap=True)
    if damage == "corrupt":
        sidecar_path(paths).write_text("{not json")
    verdict, _ = bootstrap(paths, NodeConfig(), _load(paths))
    want = "hash-mismatch" if damage == "stale" else "signature-invalid"
    assert verdict.reason == want
    assert not verdict.exposed and not verdict.authorized


# --- operator signing ------------------------------------------------------------------


def test_trusted_operator_signature_verifies_ok(paths: StatePaths) -> None:
    _dropin(paths)
    cat = _load(paths)
    alice = _operator(paths)
    cfg = _trust(paths, (ALICE, alice))
    _sign_as(paths, alice, cat)
    verdict = verify(paths, cfg, cat.config_hash)
    assert verdict.authorized and verdict.reason == "ok"
    assert verdict.signer == Signer(participant_id=ALICE, key_id=alice.key_id)
    assert verdict.signer.node_id is None


# --- attacks -----------------------------------------------------------------------------


def test_attack_key_not_in_trusted_signers_is_untrusted(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    cat, _, cfg = signed
    mallory = _operator(paths, "did:example:mallory")
    _sign_as(paths, mallory, cat)
    assert verify(paths, cfg, cat.config_hash).reason == "untrusted-signer"


def test_attack_swapped_signer_is_signature_invalid(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    cat, alice, cfg = signed
    bob = _operator(paths, BOB)
    # Names Alice (trusted) but was signed by Bob's key.
    _put_sidecar(paths, sign(cat.config_hash, bob, _op_signer(alice)))
    assert verify(paths, cfg, cat.config_hash).reason == "signature-invalid"


def test_attack_edited_config_hash_without_resigning_is_signature_invalid(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    _, _, cfg = signed
    old = msgspec.json.decode(sidecar_path(paths).read_bytes(), type=ConfigSignature)
    _dropin(paths, "test.sneaky", name="60-sneaky.json")
    new = _load(paths)
    forged = msgspec.structs.replace(
        old, config_hash=msgspec.structs.replace(old.config_hash, value=new.config_hash)
    )
    _put_sidecar(paths, forged)
    assert verify(paths, cfg, new.config_hash).reason == "signature-invalid"


def test_attack_valid_signature_over_another_config_is_hash_mismatch(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    cat, alice, cfg = signed
    _put_sidecar(paths, sign(_other_hash(), alice, _op_signer(alice)))
    assert verify(paths, cfg, cat.config_hash).reason == "hash-mismatch"


def test_attack_sidecar_for_another_connector_is_signature_invalid(
    paths: StatePaths,
    signed: tuple[Catalog, KeyPair, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cat, alice, cfg = signed
    with monkeypatch.context() as m:  # a genuine signature, made for another module
        m.setattr(catalog, "MODULE_ID", "sensorium-other")
        other = sign(cat.config_hash, alice, _op_signer(alice))
    assert other.connector_id == "sensorium-other"
    _put_sidecar(paths, other)
    assert verify(paths, cfg, cat.config_hash).reason == "signature-invalid"


def test_attack_flipped_signature_byte_is_signature_invalid(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    cat, _, cfg = signed
    sc = msgspec.json.decode(sidecar_path(paths).read_bytes(), type=ConfigSignature)
    raw = bytearray(unb64url(sc.signature.value))
    raw[10] ^= 0x01
    _put_sidecar(paths, msgspec.structs.replace(sc, signature=SignatureValue(value=b64url(raw))))
    assert verify(paths, cfg, cat.config_hash).reason == "signature-invalid"


@pytest.mark.parametrize("text", ["{not json", "", "[]", '{"schema": "x"}'])
def test_attack_malformed_sidecar_is_signature_invalid(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig], text: str
) -> None:
    cat, _, cfg = signed
    sidecar_path(paths).write_text(text)
    verdict = verify(paths, cfg, cat.config_hash)
    assert verdict.reason == "signature-invalid" and not verdict.exposed


def test_attack_signer_naming_both_node_and_participant_is_signature_invalid(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    cat, alice, cfg = signed
    both = Signer(participant_id=ALICE, node_id="node:whatever", key_id=alice.key_id)
    _put_sidecar(paths, sign(cat.config_hash, alice, both))
    assert verify(paths, cfg, cat.config_hash).reason == "signature-invalid"


def _elsewhere(paths: StatePaths) -> list[Path]:
    name = sidecar_path(paths).name
    return [
        paths.root / name,
        paths.config / name,
        paths.connectors_config / name,
        paths.connectors_config / ".signatures" / name,
        paths.root / ".signatures" / name,
    ]


@pytest.mark.parametrize("where", range(5))
def test_attack_sidecar_outside_config_signatures_is_missing(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig], where: int
) -> None:
    cat, _, cfg = signed
    good = sidecar_path(paths).read_bytes()
    sidecar_path(paths).unlink()
    target = _elsewhere(paths)[where]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(good)
    assert verify(paths, cfg, cat.config_hash).reason == "missing"


def test_attack_sidecar_only_in_factory_tree_is_missing(
    paths: StatePaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The installed package folder is redirected to a copy, so the repo is never written.
    real_files = resources.files
    package = tmp_path / "pkg"
    shipped = Path(str(real_files("sensorium.connectors.os"))) / "factory"
    shutil.copytree(shipped, package / "factory")

    def files(anchor: str) -> Any:
        return package if anchor == "sensorium.connectors.os" else real_files(anchor)

    monkeypatch.setattr(catalog, "resources", SimpleNamespace(files=files))
    _dropin(paths)
    cat = _load(paths)
    alice = _operator(paths)
    cfg = _trust(paths, (ALICE, alice))
    good = sign(cat.config_hash, alice, _op_signer(alice))
    (package / "factory" / sidecar_path(paths).name).write_bytes(msgspec.json.encode(good))
    verdict, did_sign = bootstrap(paths, cfg, cat)
    assert not did_sign
    assert verdict.reason == "missing"
    assert not sidecar_path(paths).is_relative_to(package)


def test_attack_trusted_key_claimed_by_another_participant_is_untrusted(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    cat, alice, _ = signed
    # node.json trusts Alice's key only as Bob; the sidecar claims it as Alice.
    cfg = _trust(paths, (BOB, alice))
    assert verify(paths, cfg, cat.config_hash).reason == "untrusted-signer"
    # ...and the reverse: trusted as Alice, the sidecar claims Bob with the same key.
    cfg = _trust(paths, (ALICE, alice))
    claimed = Signer(participant_id=BOB, key_id=alice.key_id)
    _put_sidecar(paths, sign(cat.config_hash, alice, claimed))
    assert verify(paths, cfg, cat.config_hash).reason == "untrusted-signer"


# --- the signing domain ------------------------------------------------------------------


def test_raw_signature_over_the_hash_hex_does_not_verify(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    cat, alice, cfg = signed
    sc = msgspec.json.decode(sidecar_path(paths).read_bytes(), type=ConfigSignature)
    raw = alice.signing_key.sign(cat.config_hash.encode()).signature
    _put_sidecar(paths, msgspec.structs.replace(sc, signature=SignatureValue(value=b64url(raw))))
    assert verify(paths, cfg, cat.config_hash).reason == "signature-invalid"


def test_signature_under_another_signing_domain_does_not_verify(
    paths: StatePaths,
    signed: tuple[Catalog, KeyPair, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cat, alice, cfg = signed
    with monkeypatch.context() as m:
        m.setattr(authz, "SIGNING_DOMAIN", "some.other.purpose.v1")
        sidecar = sign(cat.config_hash, alice, _op_signer(alice), "sensorium-wrapper.v1")
        write_sidecar(paths, sidecar, cat.config)
    assert verify(paths, cfg, cat.config_hash).reason == "signature-invalid"


# --- the two forms: the seed's (over the hash) and the wrapper -----------------------------


def test_the_sidecar_written_is_the_seeds_form_checkable_without_sensorium(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    """Seed 048: an Ed25519 signature over the canonical hash of the effective
    configuration — here checked with nothing but RFC 8785, hashlib and PyNaCl."""
    _cat, alice, _cfg = signed
    doc = json.loads(sidecar_path(paths).read_text())
    effective = json.loads(signed_snapshot_path(paths).read_text())
    digest = hashlib.sha256(rfc8785.dumps(effective)).digest()
    assert doc["config_hash"] == {"alg": "sha-256", "value": digest.hex()}
    sig = base64.urlsafe_b64decode(doc["signature"]["value"] + "==")
    VerifyKey(bytes(alice.signing_key.verify_key)).verify(digest, sig)


def test_a_sidecar_a_seed_signer_made_verifies(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    """A signer following the seed, knowing only the effective configuration."""
    cat, alice, cfg = signed
    digest = hashlib.sha256(rfc8785.dumps(cat.config)).digest()
    sig = alice.signing_key.sign(digest).signature
    doc = {
        "schema": "orbiplex-connector-config-signature.v1",
        "schema/v": 1,
        "connector_id": "sensorium-os",
        "config_hash": {"alg": "sha-256", "value": digest.hex()},
        "signed_at": "2026-04-19T10:00:00Z",
        "signer": {"participant/id": ALICE, "key/id": alice.key_id},
        "signature": {"alg": "ed25519", "value": base64.urlsafe_b64encode(sig).decode()},
    }
    doc["signature"]["value"] = doc["signature"]["value"].rstrip("=")
    sidecar_path(paths).write_text(json.dumps(doc))
    verdict = verify(paths, cfg, cat.config_hash)
    assert verdict.authorized and "(config-hash)" in verdict.message


def test_a_wrapper_sidecar_of_the_earlier_versions_still_verifies(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    cat, alice, cfg = signed
    _put_sidecar(paths, sign(cat.config_hash, alice, _op_signer(alice), "sensorium-wrapper.v1"))
    verdict = verify(paths, cfg, cat.config_hash)
    assert verdict.authorized and "(sensorium-wrapper.v1)" in verdict.message
    # The signature is over the wrapper, not the hash: it is no seed-form signature.
    sc = msgspec.json.decode(sidecar_path(paths).read_bytes(), type=ConfigSignature)
    wrong = alice.signing_key.sign(bytes.fromhex(_other_hash())).signature
    forged = msgspec.structs.replace(sc, signature=SignatureValue(value=b64url(wrong)))
    _put_sidecar(paths, forged)
    assert verify(paths, cfg, cat.config_hash).reason == "signature-invalid"


# --- per-dispatch re-verification ----------------------------------------------------------


@pytest.fixture
def authorizer(paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]) -> Authorizer:
    cat, _, cfg = signed
    verdict = verify(paths, cfg, cat.config_hash)
    assert verdict.reason == "ok"
    return Authorizer(paths, cat, verdict)


def test_authorizer_reuses_the_verdict_when_nothing_changed(authorizer: Authorizer) -> None:
    first = authorizer.verdict
    assert authorizer.check() is first
    assert authorizer.check() is first
    assert authorizer.reverified == 0


def test_authorizer_edited_dropin_is_hash_mismatch_at_next_check(
    paths: StatePaths, authorizer: Authorizer
) -> None:
    _dropin(paths, "test.changed")
    verdict = authorizer.check()
    assert verdict.reason == "hash-mismatch" and not verdict.exposed
    assert authorizer.reverified == 1


def test_authorizer_edit_and_resign_without_restart_is_still_hash_mismatch(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig], authorizer: Authorizer
) -> None:
    _, alice, cfg = signed
    _dropin(paths, "test.changed")
    on_disk = _load(paths)
    _sign_as(paths, alice, on_disk)
    assert verify(paths, cfg, on_disk.config_hash).reason == "ok"  # valid for the disk...
    assert authorizer.check().reason == "hash-mismatch"  # ...not for what is running


def test_authorizer_corrupted_sidecar_is_signature_invalid(
    paths: StatePaths, authorizer: Authorizer
) -> None:
    sc = msgspec.json.decode(sidecar_path(paths).read_bytes(), type=ConfigSignature)
    sig = bytearray(unb64url(sc.signature.value))
    sig[0] ^= 0x80
    bad = msgspec.structs.replace(sc, signature=SignatureValue(value=b64url(sig)))
    sidecar_path(paths).write_bytes(msgspec.json.format(msgspec.json.encode(bad)) + b"\n")
    assert authorizer.check().reason == "signature-invalid"


def test_authorizer_returns_to_ok_when_originals_are_restored(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig], authorizer: Authorizer
) -> None:
    _, alice, _ = signed
    dropin = catalog.dropin_dir(paths) / "50-test.json"
    orig_dropin, orig_sidecar = dropin.read_bytes(), sidecar_path(paths).read_bytes()
    _dropin(paths, "test.changed")
    _sign_as(paths, alice, _load(paths))
    assert authorizer.check().reason == "hash-mismatch"
    sidecar_path(paths).write_text("garbage")
    dropin.write_bytes(orig_dropin)
    assert authorizer.check().reason == "signature-invalid"
    sidecar_path(paths).write_bytes(orig_sidecar)
    verdict = authorizer.check()
    assert verdict.reason == "ok" and verdict.authorized


def test_authorizer_removed_sidecar_is_missing(paths: StatePaths, authorizer: Authorizer) -> None:
    sidecar_path(paths).unlink()
    assert authorizer.check().reason == "missing"


def test_authorizer_untrusting_the_operator_is_untrusted_signer(
    paths: StatePaths, authorizer: Authorizer
) -> None:
    _trust(paths)  # node.json now trusts nobody but the node key
    verdict = authorizer.check()
    assert verdict.reason == "untrusted-signer" and not verdict.exposed


def test_authorizer_unreadable_node_config_fails_closed(
    paths: StatePaths, authorizer: Authorizer
) -> None:
    paths.node_config.write_text("{broken")
    verdict = authorizer.check()
    assert not verdict.exposed and verdict.reason == "untrusted-signer"


def test_verdict_exposed_only_when_authorized_or_tolerated() -> None:
    assert Verdict(True, "ok", "").exposed
    assert Verdict(False, "missing", "", tolerated=True).exposed
    for reason in ("missing", "hash-mismatch", "signature-invalid", "untrusted-signer"):
        assert not Verdict(False, reason, "").exposed  # type: ignore[arg-type]


# --- found by these tests, fixed -------------------------------------------------------


def test_authorizer_sees_an_edit_made_between_start_load_and_its_construction(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig]
) -> None:
    _, _, cfg = signed
    inputs = fingerprint(paths)  # as ConnectorService.__init__: before loading
    cat = _load(paths)
    _dropin(paths, "test.changed")  # the operator saves a file in that window
    verdict, _ = bootstrap(paths, cfg, cat)
    assert verdict.reason == "ok"  # correct for the catalog that was loaded
    assert Authorizer(paths, cat, verdict, inputs).check().reason == "hash-mismatch"


@pytest.mark.parametrize("damage", ["mode-0644", "truncated"])
def test_verify_does_not_raise_for_a_damaged_node_key_file(
    paths: StatePaths, signed: tuple[Catalog, KeyPair, NodeConfig], damage: str
) -> None:
    cat, _, cfg = signed
    key = paths.keys / "node.key"
    if damage == "mode-0644":
        key.chmod(0o644)
    else:
        key.write_bytes(b"short")
    assert isinstance(verify(paths, cfg, cat.config_hash), Verdict)


# --- found in review, fixed ---------------------------------------------------------------


def _signed_running(paths: StatePaths) -> tuple[Catalog, Authorizer]:
    _dropin(paths)
    cat = _load(paths)
    pair = _operator(paths)
    cfg = _trust(paths, (ALICE, pair))
    _sign_as(paths, pair, cat)
    verdict, _ = bootstrap(paths, cfg, cat)
    assert verdict.authorized
    return cat, Authorizer(paths, cat, verdict)


def test_a_reverification_that_crashes_fails_closed_and_is_retried(paths: StatePaths) -> None:
    _cat, authorizer = _signed_running(paths)
    deep = b'{"action_catalog": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    (catalog.dropin_dir(paths) / "60-deep.json").write_bytes(deep)
    sidecar_path(paths).unlink()
    first = authorizer.check()
    assert not first.exposed
    assert not authorizer.check().exposed  # not frozen on a stale "ok"


def test_signing_covers_exactly_the_catalog_that_was_reviewed(paths: StatePaths) -> None:
    _dropin(paths)
    shown = _load(paths)
    pair = _operator(paths)
    cfg = _trust(paths, (ALICE, pair))
    _dropin(paths, "test.evil", name="70-evil.json")  # lands while the operator reads
    sign_catalog(paths, cfg, shown, pair)
    sidecar = msgspec.json.decode(sidecar_path(paths).read_bytes(), type=ConfigSignature)
    assert sidecar.config_hash.value == shown.config_hash
    on_disk = catalog.load(paths, materialize_defaults=False)
    assert verify(paths, cfg, on_disk.config_hash).reason == "hash-mismatch"


def test_signing_with_an_untrusted_key_leaves_the_valid_sidecar_alone(paths: StatePaths) -> None:
    cat, _authorizer = _signed_running(paths)
    before = sidecar_path(paths).read_bytes()
    mallory = _operator(paths, "did:example:mallory")
    with pytest.raises(ValueError, match="not a trusted signer"):
        sign_catalog(paths, load_node_config(paths), cat, mallory)
    assert sidecar_path(paths).read_bytes() == before


def test_diff_base_is_the_configuration_the_sidecar_signs(paths: StatePaths) -> None:
    cat, _authorizer = _signed_running(paths)
    assert signed_config(paths) == cat.config
    old = sidecar_path(paths).read_bytes()
    _dropin(paths, "test.second", name="60-second.json")
    pair = _operator(paths, "did:example:bob")
    cfg = _trust(paths, (ALICE, pair), ("did:example:bob", pair))
    sign_catalog(paths, cfg, catalog.load(paths, materialize_defaults=False), pair)
    sidecar_path(paths).write_bytes(old)  # an older sidecar restored on its own
    assert signed_config(paths) is None  # the snapshot is not what it signs


def test_a_fifo_at_the_sidecar_path_is_refused_not_waited_on(paths: StatePaths) -> None:
    import os
    import threading

    cat, _authorizer = _signed_running(paths)
    sidecar_path(paths).unlink()
    os.mkfifo(sidecar_path(paths))
    got = []
    # Opening the FIFO would wait for a writer that never comes: a hang, not a delay.
    reader = threading.Thread(
        target=lambda: got.append(verify(paths, load_node_config(paths), cat.config_hash)),
        daemon=True,
    )
    reader.start()
    reader.join(60)
    assert got, "verify waited on the FIFO"
    verdict = got[0]
    assert not verdict.authorized and verdict.reason == "signature-invalid"


def test_a_trusted_entry_whose_key_id_is_not_its_keys_is_ignored(paths: StatePaths) -> None:
    _dropin(paths)
    cat = _load(paths)
    alice, bob = _operator(paths), _operator(paths, "did:example:bob")
    forged = {"participant/id": ALICE, "key/id": alice.key_id, "public_key": bob.public_key}
    paths.node_config.write_text(json.dumps({"trusted_signers": [forged]}))
    sidecar = sign(cat.config_hash, bob, Signer(participant_id=ALICE, key_id=alice.key_id))
    _put_sidecar(paths, sidecar)
    assert verify(paths, load_node_config(paths), cat.config_hash).reason == "untrusted-signer"


def test_a_looping_link_among_the_drop_ins_hides_no_other_drop_in(paths: StatePaths) -> None:
    """Found in review: one drop-in entry whose type cannot be read (a link to itself,
    a link through a file) dropped every drop-in from the fingerprint, so an in-place
    edit of a real one went unseen. The fingerprint names what source_files names."""
    real = _dropin(paths, "test.one", name="20-real.json")
    d = catalog.dropin_dir(paths)
    (d / "10-loop.json").symlink_to(d / "10-loop.json")
    (d / "30-through.json").symlink_to("/etc/hostname/x")
    named = [f for f, *_ in fingerprint(paths)]
    assert [str(p) for p in catalog.source_files(paths)] == named[4:]
    assert str(real) in named
    before = fingerprint(paths)
    real.write_text(real.read_text() + " ")
    assert fingerprint(paths) != before
