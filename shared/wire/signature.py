"""``orbiplex-connector-config-signature.v1``: the detached sidecar that authorizes a
connector's merged effective configuration (seed 048, "Sidecar file").

What ``signature.value`` signs — two forms, both accepted, the first written:

- ``config-hash`` (the seed's): Ed25519 over the canonical hash itself, the 32 bytes
  of sha-256 over the RFC 8785 (JCS) serialization of the effective configuration
  (``config_hash.value`` is their hex). A signer that follows seed 048 makes and checks
  these with nothing of Sensorium's.
- ``sensorium-wrapper.v1`` (a Sensorium extension: what this node wrote before it
  wrote the seed's form, and still writes on request): Ed25519 over the JCS of ``{"signing_domain":
  "sensorium.os.action-catalog.v1", "connector_id", "config_hash", "signed_at",
  "signer"}`` (the sidecar's own fields), which also binds the domain, the connector,
  the time and the signer. A later wrapper would be ``…wrapper.v2``, never a change
  to v1.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from sensorium.shared.wire.base import Message, Timestamp

# The domain the wrapper form binds (seed 048's signing_domain for this artifact).
SIGNING_DOMAIN = "sensorium.os.action-catalog.v1"
SignatureForm = Literal["config-hash", "sensorium-wrapper.v1"]
SIGNATURE_FORMS: tuple[SignatureForm, ...] = ("config-hash", "sensorium-wrapper.v1")
Hex64 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")]


class ConfigHash(Message, frozen=True, kw_only=True):
    alg: Literal["sha-256"] = "sha-256"
    value: Hex64


class Signer(Message, frozen=True, kw_only=True, omit_defaults=True):
    """Exactly one of ``participant/id`` (an operator) and ``node_id`` (the node's own
    bootstrap signature, seed 048's ``signer.node_id``).

    ``node/id`` is how earlier versions of this node spelled ``node_id``: still read (the
    signature covers the signer as it was written, so it is verified in that spelling),
    never written. Compare signers by :meth:`normalized`."""

    participant_id: str | None = msgspec.field(name="participant/id", default=None)
    node_id: str | None = None
    legacy_node_id: str | None = msgspec.field(name="node/id", default=None)
    key_id: str = msgspec.field(name="key/id")

    @property
    def node(self) -> str | None:
        """The node id, in either spelling."""
        return self.node_id if self.node_id is not None else self.legacy_node_id

    @property
    def subject(self) -> str | None:
        """Who signed: the operator's participant id or the node id."""
        return self.participant_id if self.participant_id is not None else self.node

    def normalized(self) -> Signer:
        """The signer as written today (``node/id`` read as ``node_id``)."""
        if self.legacy_node_id is None:
            return self
        return msgspec.structs.replace(self, node_id=self.node, legacy_node_id=None)


class SignatureValue(Message, frozen=True, kw_only=True):
    """Ed25519 (base64url) over the canonical hash, or the sensorium-wrapper.v1 payload."""

    alg: Literal["ed25519"] = "ed25519"
    value: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]+\Z", max_length=128)]


class ConfigSignature(Message, frozen=True, kw_only=True):
    schema: Literal["orbiplex-connector-config-signature.v1"] = (
        "orbiplex-connector-config-signature.v1"
    )
    schema_v: Literal[1] = msgspec.field(name="schema/v", default=1)
    connector_id: str
    config_hash: ConfigHash
    signed_at: Timestamp
    signer: Signer
    signature: SignatureValue


class TrustedSigner(Message, frozen=True, kw_only=True):
    """An operator key the node accepts catalog signatures from (``config/node.json``)."""

    participant_id: str = msgspec.field(name="participant/id")
    key_id: str = msgspec.field(name="key/id")
    public_key: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{43}\Z")]
