"""examples/node/curve.mjs against libsodium: crypto_box (X25519, HSalsa20, XSalsa20,
Poly1305) and Z85 give byte for byte what PyNaCl and pyzmq give, and a forged box is
refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import nacl.public
import pytest
from zmq.utils import z85

CURVE = Path(__file__).resolve().parents[2] / "examples" / "node" / "curve.mjs"
NODE = shutil.which("node")

CHECK = """
import fs from "node:fs";
const { boxKey, seal, open, z85Decode, z85Encode, keyPair } = await import(process.argv[1]);
const v = JSON.parse(fs.readFileSync(0, "utf8"));
const h = (s) => Buffer.from(s, "hex");
const out = { box: [], z85: [], forged: [] };
for (const t of v.box) {
  const key = boxKey(h(t.their_public), h(t.secret));
  const box = seal(h(t.message), h(t.nonce), key);
  out.box.push({ shared: key.toString("hex"), box: box.toString("hex"),
                 opened: open(h(t.box), h(t.nonce), key).toString("hex") });
  const forged = h(t.box);
  forged[forged.length - 1] ^= 1;
  try { open(forged, h(t.nonce), key); out.forged.push(false); } catch { out.forged.push(true); }
}
for (const t of v.z85) {
  out.z85.push({ decoded: z85Decode(t.z85).toString("hex"), encoded: z85Encode(h(t.bytes)) });
}
const pair = keyPair();
out.pair = { public: pair.publicKey.toString("hex"), secret: pair.secretKey.toString("hex") };
console.log(JSON.stringify(out));
"""

# Lengths around Poly1305's 16-byte blocks and Salsa20's 64-byte blocks.
LENGTHS = (0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 131, 1000, 4099)


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed (apt-get install nodejs)")
def test_the_node_curve_code_matches_libsodium() -> None:
    assert NODE is not None
    cases = []
    for n in LENGTHS:
        me, them = nacl.public.PrivateKey.generate(), nacl.public.PrivateKey.generate()
        box = nacl.public.Box(me, them.public_key)
        nonce, message = os.urandom(24), os.urandom(n)
        cases.append(
            {
                "secret": bytes(me).hex(),
                "their_public": bytes(them.public_key).hex(),
                "shared": box.shared_key().hex(),
                "nonce": nonce.hex(),
                "message": message.hex(),
                "box": box.encrypt(message, nonce).ciphertext.hex(),
            }
        )
    # Z85's own test vector (rfc.zeromq.org/spec/32) and random keys.
    raw = [bytes.fromhex("864fd26fb559f75b"), *(os.urandom(32) for _ in range(4))]
    z85_cases = [{"bytes": b.hex(), "z85": z85.encode(b).decode()} for b in raw]
    assert z85_cases[0]["z85"] == "HelloWorld"

    done = subprocess.run(
        [NODE, "--input-type=module", "-e", CHECK, CURVE.as_uri()],
        input=json.dumps({"box": cases, "z85": z85_cases}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for case, got in zip(cases, out["box"], strict=True):
        assert got["shared"] == case["shared"]  # crypto_box_beforenm
        assert got["box"] == case["box"], len(case["message"]) // 2  # crypto_box_afternm
        assert got["opened"] == case["message"]
    assert out["forged"] == [True] * len(cases)
    for case, got in zip(z85_cases, out["z85"], strict=True):
        assert (got["decoded"], got["encoded"]) == (case["bytes"], case["z85"])
    # The generated pair is a real X25519 pair: its public key is its secret's.
    secret = nacl.public.PrivateKey(bytes.fromhex(out["pair"]["secret"]))
    assert bytes(secret.public_key).hex() == out["pair"]["public"]
