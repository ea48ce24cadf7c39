"""``allowlist/ref`` of an outcome record: the signed catalog that admitted it.

The connector's module report names the catalog's config hash; who signed it is in the
detached sidecar beside it (``signatures/MODULE.sig.json``), read once per hash.
"""

from __future__ import annotations

import msgspec

from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.audit import AllowlistRef
from sensorium.shared.wire.report import ModuleReport
from sensorium.shared.wire.signature import ConfigSignature


class AllowlistRefs:
    def __init__(self, paths: StatePaths) -> None:
        self._paths = paths
        self._signers: dict[str, dict[str, str] | None] = {}

    def __repr__(self) -> str:
        return f"<AllowlistRefs {len(self._signers)} hashes>"

    def ref(self, report: ModuleReport) -> AllowlistRef:
        return AllowlistRef(
            hash=report.config_hash,
            version=report.config_authorization,
            signer=self._signer(report),
        )

    def _signer(self, report: ModuleReport) -> dict[str, str] | None:
        key = f"{report.module_id}|{report.config_hash}"
        if key not in self._signers:
            self._signers[key] = _read_signer(self._paths, report)
        return self._signers[key]


def _read_signer(paths: StatePaths, report: ModuleReport) -> dict[str, str] | None:
    """The sidecar's signer when it signs this very hash (None: unsigned, or another)."""
    try:
        sidecar = msgspec.json.decode(
            (paths.signatures / f"{report.module_id}.sig.json").read_bytes(),
            type=ConfigSignature,
        )
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not report.config_hash.endswith(sidecar.config_hash.value):
        return None
    signer = sidecar.signer.normalized()
    named = {
        "participant/id": signer.participant_id,
        "node_id": signer.node_id,
        "key/id": signer.key_id,
    }
    return {k: v for k, v in named.items() if v is not None}
