"""How a routing id is named in the log and in a `routing-id-in-use` message."""

from __future__ import annotations

from sensorium.shared.rpc.identities import printable


def test_a_text_routing_id_is_logged_as_text() -> None:
    assert printable(b"twin") == "twin"
    assert printable(b"sensorium-poller:01J") == "sensorium-poller:01J"


def test_a_binary_or_generated_routing_id_is_logged_as_hex() -> None:
    assert printable(b"\x00k\x8bEg") == "0x006b8b4567"  # one libzmq made up
    assert printable(b"tab\there") == "0x" + b"tab\there".hex()
    assert printable("é".encode()) == "0xc3a9"
    assert printable(b"") == "0x"
