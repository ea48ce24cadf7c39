"""Catalog authorization: the detached sidecar, its verification, and the three postures.

What is signed is seed 048's form: the canonical hash of the effective configuration
itself (``config-hash``). Sidecars of the Sensorium wrapper form
(``sensorium-wrapper.v1``: the JCS of the sidecar's own fields under the signing domain)
verify too, and ``sign(..., form=...)`` still makes them (``shared/wire/signature.py``
says exactly which bytes each form signs). Verification runs at start and before every
dispatch; a stat-keyed cache makes the repeat cheap, and any change to the sidecar, a
catalog source, the trusted-signer list or a pinned interpreter forces a full re-verify.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from sensorium.connectors.os.catalog import interpreters
from sensorium.connectors.os.catalog import sources as catalog_mod
from sensorium.shared.canonical import canonical_json, sha256_hex
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import ConfigError, NodeConfig, load_node_config
from sensorium.shared.files import read_regular
from sensorium.shared.keys import (
    NODE_PUB,
    KeyPair,
    b64url,
    key_id,
    node_id,
    node_key,
    node_public_key,
    unb64url,
)
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.signature import (
    SIGNATURE_FORMS,
    SIGNING_DOMAIN,
    ConfigHash,
    ConfigSignature,
    SignatureForm,
    SignatureValue,
    Signer,
)

# config/authorization as the seed names it (plus untrusted-signer, which the issue adds).
Reason = Literal["ok", "missing", "hash-mismatch", "signature-invalid", "untrusted-signer"]
MAX_SIDECAR_BYTES = 64 * 1024


@dataclass(frozen=True)
class Verdict:
    """Whether the running catalog may be exposed, and why (or why not)."""

    authorized: bool
    reason: Reason
    message: str
    signer: Signer | None = None
    # A missing sidecar, tolerated because the catalog sets allow_unsigned_bootstrap.
    tolerated: bool = False

    @property
    def exposed(self) -> bool:
        """Authorized, or tolerated unsigned under ``allow_unsigned_bootstrap``."""
        return self.authorized or self.tolerated


def sidecar_path(paths: StatePaths) -> Path:
    return paths.signatures / f"{catalog_mod.MODULE_ID}.sig.json"


def signed_snapshot_path(paths: StatePaths) -> Path:
    """The effective configuration as it was signed, kept for `sensorium catalog diff`."""
    return paths.signatures / f"{catalog_mod.MODULE_ID}.signed.json"


def _payload(
    form: SignatureForm,
    connector_id: str,
    config_hash: ConfigHash,
    signed_at: str,
    signer: Signer,
) -> bytes:
    """The bytes a sidecar's signature covers, in one of the two forms."""
    if form == "config-hash":
        return bytes.fromhex(config_hash.value)  # the sha-256 itself, 32 bytes
    return canonical_json(
        {
            "signing_domain": SIGNING_DOMAIN,
            "connector_id": connector_id,
            "config_hash": msgspec.to_builtins(config_hash),
            "signed_at": signed_at,
            "signer": msgspec.to_builtins(signer),
        }
    )


def sign(
    config_hash: str, pair: KeyPair, signer: Signer, form: SignatureForm = "config-hash"
) -> ConfigSignature:
    digest = ConfigHash(value=config_hash)
    signed_at = rfc3339()
    sig = pair.signing_key.sign(
        _payload(form, catalog_mod.MODULE_ID, digest, signed_at, signer)
    ).signature
    return ConfigSignature(
        connector_id=catalog_mod.MODULE_ID,
        config_hash=digest,
        signed_at=signed_at,
        signer=signer,
        signature=SignatureValue(value=b64url(sig)),
    )


def write_sidecar(
    paths: StatePaths,
    sidecar: ConfigSignature,
    effective: dict[str, object],
    *,
    exclusive: bool = False,
) -> Path:
    """Atomically write the sidecar (and the signed snapshot) into the active config area.

    ``exclusive``: fail with ``FileExistsError`` rather than replace a sidecar that
    appeared meanwhile (the node never replaces one; an operator may have just signed).
    """
    paths.signatures.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.signatures, 0o700)
    for path, data in (
        (signed_snapshot_path(paths), msgspec.json.format(msgspec.json.encode(effective))),
        (sidecar_path(paths), msgspec.json.format(msgspec.json.encode(sidecar))),
    ):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data + b"\n")
        os.chmod(tmp, 0o644)
        if exclusive and path == sidecar_path(paths):
            try:
                os.link(tmp, path)  # fails if the name exists: no check-then-replace race
            finally:
                tmp.unlink()
        else:
            os.replace(tmp, path)
    return sidecar_path(paths)


def sign_catalog(
    paths: StatePaths,
    cfg: NodeConfig,
    cat: catalog_mod.Catalog,
    pair: KeyPair,
    form: SignatureForm = "config-hash",
) -> ConfigSignature:
    """The operator's act: sign exactly ``cat`` (the catalog the operator reviewed) and
    write the sidecar. Refuses (``ValueError``, old sidecar untouched) a catalog that does
    not validate, or a key this node would not trust."""
    if not cat.valid:
        raise ValueError("; ".join(str(p) for p in cat.problems))
    signer = Signer(participant_id=pair.participant_id, key_id=pair.key_id)
    known = _trusted(paths, cfg).get(pair.key_id)
    if known is None or known[1] != signer:
        raise ValueError(
            f"{pair.participant_id} ({pair.key_id}) is not a trusted signer of this node; "
            "add it with `sensorium keys new --trust` (or to trusted_signers in node.json) "
            "first — the current sidecar is left as it is"
        )
    sidecar = sign(cat.config_hash, pair, signer, form)
    write_sidecar(paths, sidecar, cat.config)
    return sidecar


def sign_effective(paths: StatePaths, pair: KeyPair) -> ConfigSignature:
    """Sign the effective configuration as it is on disk now (headless use)."""
    return sign_catalog(
        paths, load_node_config(paths), catalog_mod.load(paths, materialize_defaults=False), pair
    )


def signed_config(paths: StatePaths) -> dict[str, object] | None:
    """The configuration the current sidecar signs, if the snapshot beside it is that one."""
    try:
        sidecar = msgspec.json.decode(
            read_regular(sidecar_path(paths), MAX_SIDECAR_BYTES), type=ConfigSignature
        )
        snapshot = json.loads(
            read_regular(signed_snapshot_path(paths), catalog_mod.MAX_CONFIG_BYTES)
        )
    except (OSError, ValueError, msgspec.DecodeError, RecursionError):
        return None
    try:
        matches = sha256_hex(snapshot) == sidecar.config_hash.value
    except (ValueError, TypeError):
        return None
    return snapshot if matches and isinstance(snapshot, dict) else None


def node_signer(pair: KeyPair) -> Signer:
    return Signer(node_id=node_id(pair), key_id=pair.key_id)


def _trusted(paths: StatePaths, cfg: NodeConfig) -> dict[str, tuple[VerifyKey, Signer]]:
    """Trusted keys by key/id; an entry whose key/id is not its key's is ignored (it could
    otherwise shadow another key or misname the signer in audit)."""
    keys: dict[str, tuple[VerifyKey, Signer]] = {}
    node = node_public_key(paths)
    if node is not None:
        kid = key_id(node)
        keys[kid] = (node, Signer(node_id=f"node:{kid}", key_id=kid))
    for t in cfg.trusted_signers:
        try:
            vk = VerifyKey(unb64url(t.public_key))
        except (ValueError, TypeError):
            continue
        if key_id(vk) != t.key_id:
            continue
        keys[t.key_id] = (vk, Signer(participant_id=t.participant_id, key_id=t.key_id))
    return keys


def verify(paths: StatePaths, cfg: NodeConfig, config_hash: str) -> Verdict:
    """Check the sidecar against ``config_hash``; never raises for what is on disk."""
    path = sidecar_path(paths)
    try:
        raw = read_regular(path, MAX_SIDECAR_BYTES)
    except FileNotFoundError:
        return Verdict(
            False,
            "missing",
            f"no sidecar at {path}; sign the catalog with `sensorium catalog sign`",
        )
    except OSError as exc:
        return Verdict(False, "signature-invalid", f"cannot read {path}: {exc.strerror}")
    try:
        sidecar = msgspec.json.decode(raw, type=ConfigSignature)
    except (ValueError, RecursionError) as exc:  # DecodeError; UnicodeDecodeError for non-UTF-8
        return Verdict(False, "signature-invalid", f"{path} is not a valid sidecar: {exc!s:.200}")
    if sidecar.connector_id != catalog_mod.MODULE_ID:
        return Verdict(
            False,
            "signature-invalid",
            f"{path} authorizes connector {sidecar.connector_id!r}, not {catalog_mod.MODULE_ID!r}",
        )
    if sidecar.config_hash.value != config_hash:
        return Verdict(
            False,
            "hash-mismatch",
            f"the sidecar signs {sidecar.config_hash.value[:16]}…, the catalog is "
            f"{config_hash[:16]}…; review with `sensorium catalog diff`, "
            "then sign it and restart the connector",
        )
    signer = sidecar.signer
    subjects = [signer.participant_id, signer.node_id, signer.legacy_node_id]
    if sum(subject is not None for subject in subjects) != 1:
        return Verdict(
            False,
            "signature-invalid",
            "the sidecar's signer must name exactly one of node_id and participant/id",
        )
    known = _trusted(paths, cfg).get(signer.key_id)
    if known is None or known[1] != signer.normalized():
        return Verdict(
            False,
            "untrusted-signer",
            f"{signer.subject} ({signer.key_id}) is not a trusted signer of this node"
            + (
                "; add it to trusted_signers in config/node.json"
                if signer.participant_id
                else "; this is not this node's key (keys/node.pub)"
            ),
            signer.normalized(),
        )
    form = signature_form(known[0], sidecar)
    if form is None:
        return Verdict(
            False,
            "signature-invalid",
            "the sidecar's signature does not verify (in neither form: "
            f"{', '.join(SIGNATURE_FORMS)})",
            signer.normalized(),
        )
    return Verdict(True, "ok", f"signed by {signer.subject} ({form})", signer.normalized())


def signature_form(key: VerifyKey, sidecar: ConfigSignature) -> SignatureForm | None:
    """Which form the sidecar's signature verifies in under ``key``, or None."""
    try:
        raw = unb64url(sidecar.signature.value)
    except ValueError:
        return None
    for form in SIGNATURE_FORMS:
        # Over the signer as written: a wrapper of the earlier shape (node/id) verifies.
        payload = _payload(
            form, sidecar.connector_id, sidecar.config_hash, sidecar.signed_at, sidecar.signer
        )
        try:
            key.verify(payload, raw)
        except (BadSignatureError, ValueError):
            continue
        return form
    return None


def _posture(verdict: Verdict, allow_unsigned: bool) -> Verdict:
    # A missing sidecar only is tolerated, and only when the operator asked for it; a
    # present but stale or broken one is never excused.
    if verdict.reason == "missing" and allow_unsigned:
        return Verdict(
            False,
            "missing",
            "UNSIGNED: allow_unsigned_bootstrap is set, so the missing sidecar is tolerated; "
            "every outcome carries connector/unauthorized: true. Sign the catalog and remove "
            "the flag.",
            tolerated=True,
        )
    return verdict


def bootstrap(paths: StatePaths, cfg: NodeConfig, cat: catalog_mod.Catalog) -> tuple[Verdict, bool]:
    """Start-time authorization. Host bootstrap: a sidecar that is *absent*, for a catalog
    materialized this start and still pristine, is signed with the node-self key. Returns
    the verdict and whether the node signed."""
    signed = False
    pair = node_key(paths)  # the node-self key exists from the first start, whatever the posture
    assert pair is not None
    if not sidecar_path(paths).exists() and cat.materialized and cat.valid and cat.pristine:
        try:
            write_sidecar(
                paths, sign(cat.config_hash, pair, node_signer(pair)), cat.config, exclusive=True
            )
            signed = True
        except FileExistsError:
            pass  # an operator signed meanwhile: theirs stands
    return _posture(verify(paths, cfg, cat.config_hash), cat.allow_unsigned_bootstrap), signed


def fingerprint(paths: StatePaths) -> tuple[object, ...]:
    """What, if changed, forces a full re-verify: sidecar, node.json, every catalog source."""
    return _fingerprint(_inputs(paths))


def _inputs(paths: StatePaths) -> tuple[str, ...]:
    """The fixed paths ``fingerprint`` stats, the drop-in directory fourth (its listing:
    a file added or removed). Worked out once per Authorizer: pathlib cost more than
    the stats themselves."""
    return (
        str(sidecar_path(paths)),
        str(paths.node_config),
        str(paths.keys / NODE_PUB),
        str(catalog_mod.dropin_dir(paths)),
        str(catalog_mod.operator_file(paths)),
    )


def _fingerprint(inputs: tuple[str, ...]) -> tuple[object, ...]:
    """Taken before every dispatch, so by plain ``os`` calls on strings (``source_files``'
    order and choice, without pathlib's objects)."""
    dropins = inputs[3]
    files = list(inputs)
    try:
        with os.scandir(dropins) as entries:
            files += sorted(e.path for e in entries if _is_source(e))
    except OSError as exc:
        if exc.errno not in _ABSENT:
            raise  # as Path.iterdir did: an unreadable drop-in directory is an error
    # No drop-in directory (or not one): only what is listed above.
    out: list[object] = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((f, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            out.append((f, None))
    return tuple(out)


# What pathlib's is_dir()/is_file() read as "no" rather than raise (its _IGNORED_ERRNOS).
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def _is_source(entry: os.DirEntry[str]) -> bool:
    """``sources.source_files``' choice: a regular file (links followed) with suffix
    ``.json`` (Path.suffix's rule: ".json" alone has none). A link that loops or leads
    nowhere is not one, as for Path.is_file(); it never hides the other entries."""
    if not entry.name.endswith(".json") or entry.name == ".json":
        return False
    try:
        return entry.is_file()
    except OSError as exc:
        if exc.errno in _ABSENT:
            return False
        raise


class Authorizer:
    """Re-verifies before every dispatch; a stat of the inputs decides whether it must."""

    def __init__(
        self,
        paths: StatePaths,
        cat: catalog_mod.Catalog,
        verdict: Verdict,
        inputs: tuple[object, ...] | None = None,
    ) -> None:
        """``inputs``: ``fingerprint(paths)`` taken *before* the catalog was loaded, so an
        edit made while the connector started is still seen as a change."""
        self.paths = paths
        self._inputs = _inputs(paths)
        self.running_hash = cat.config_hash
        self.allow_unsigned = cat.allow_unsigned_bootstrap
        self.pins = list(cat.pins.values())
        self.verdict = verdict
        # A pinned interpreter as it was when hashed at load.
        pinned = tuple(p.identity for p in self.pins)
        self._key = (inputs if inputs is not None else fingerprint(paths)) + pinned
        self.reverified = 0

    def __repr__(self) -> str:
        return f"<Authorizer {self.verdict.reason} running={self.running_hash[:12]}>"

    def check(self) -> Verdict:
        key = _fingerprint(self._inputs) + tuple(interpreters.identity(p.path) for p in self.pins)
        if key == self._key:
            return self.verdict
        self.reverified += 1
        try:
            verdict = self._reverify()
        except Exception as exc:  # fail closed, and do not cache: the next check retries
            self.verdict = Verdict(
                False, "signature-invalid", f"could not re-verify the catalog: {exc!r:.200}"
            )
            return self.verdict
        self.verdict, self._key = verdict, key
        return verdict

    def _reverify(self) -> Verdict:
        for pin in self.pins:
            if (why := interpreters.drift(pin)) is not None:
                return Verdict(
                    False,
                    "hash-mismatch",
                    f"a pinned interpreter changed since the catalog loaded — {why}; restart "
                    "the connector to resolve and pin it again (`sensorium restart connector`)",
                )
        on_disk = catalog_mod.load(self.paths, materialize_defaults=False, validate=False)
        if on_disk.config_hash != self.running_hash:
            return Verdict(
                False,
                "hash-mismatch",
                "the catalog files changed since this connector loaded them; "
                "sign them (`sensorium catalog sign`) and restart the connector "
                "(`sensorium restart connector`)",
            )
        try:
            cfg = load_node_config(self.paths)
        except ConfigError as exc:
            return Verdict(False, "untrusted-signer", f"cannot read the trusted signers: {exc}")
        return _posture(verify(self.paths, cfg, self.running_hash), self.allow_unsigned)
