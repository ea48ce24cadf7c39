// CurveZMQ for a client, in plain Node.js with no dependency: what a tcp endpoint of a
// Sensorium node speaks (docs/wire-protocol.md, "CURVE").
//
// - Z85 (rfc.zeromq.org/spec/32) and ZeroMQ certificate files (the zcert format
//   `sensorium keys client add` writes);
// - NaCl's crypto_box: X25519 (node:crypto) -> HSalsa20 -> XSalsa20 + Poly1305, the
//   last three here since node:crypto has no XSalsa20-Poly1305;
// - the client side of the CURVE handshake (rfc.zeromq.org/spec/26 and /25): HELLO,
//   WELCOME, INITIATE, READY, then every frame as a MESSAGE box.
//
// Checked against libsodium (PyNaCl) by tests/integration/test_node_curve.py.
import crypto from "node:crypto";
import fs from "node:fs";

// --- Z85 ---------------------------------------------------------------------------

const Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
const Z85_VALUE = new Map([...Z85].map((c, i) => [c, i]));

export function z85Decode(text) {
  if (text.length % 5) throw new Error("Z85 text must be a multiple of 5 characters");
  const out = Buffer.alloc((text.length / 5) * 4);
  for (let i = 0; i < text.length; i += 5) {
    let value = 0;
    for (const c of text.slice(i, i + 5)) {
      const digit = Z85_VALUE.get(c);
      if (digit === undefined) throw new Error(`not a Z85 character: ${JSON.stringify(c)}`);
      value = value * 85 + digit;
    }
    if (value > 0xffffffff) throw new Error("Z85 group out of range");
    out.writeUInt32BE(value, (i / 5) * 4);
  }
  return out;
}

export function z85Encode(bytes) {
  if (bytes.length % 4) throw new Error("Z85 encodes a multiple of 4 bytes");
  let text = "";
  for (let i = 0; i < bytes.length; i += 4) {
    let value = bytes.readUInt32BE(i);
    let group = "";
    for (let j = 0; j < 5; j++) {
      group = Z85[value % 85] + group;
      value = Math.floor(value / 85);
    }
    text += group;
  }
  return text;
}

// A ZeroMQ certificate: sections `metadata` and `curve`, `key = "value"` lines indented
// under them, `#` comments. Returns the metadata and the decoded keys.
export function readCert(path) {
  const sections = { metadata: {}, curve: {} };
  let section = null;
  for (const line of fs.readFileSync(path, "utf8").split("\n")) {
    if (!line.trim() || line.trimStart().startsWith("#")) continue;
    if (!/^\s/.test(line)) {
      section = sections[line.trim()] ?? null;
      continue;
    }
    const m = /^\s+([\w-]+)\s*=\s*"?([^"]*)"?\s*$/.exec(line);
    if (m && section) section[m[1]] = m[2];
  }
  const key = (name, where = sections.curve) => {
    const text = where[name];
    if (!text || text.length !== 40) throw new Error(`${path}: no ${name} (40 Z85 characters)`);
    return z85Decode(text);
  };
  return {
    metadata: sections.metadata,
    publicKey: key("public-key"),
    secretKey: key("secret-key"),
    serverKey: sections.metadata["server-public-key"] ? key("server-public-key", sections.metadata) : null,
  };
}

// --- Salsa20, HSalsa20, XSalsa20 ---------------------------------------------------

const SIGMA = [0x61707865, 0x3320646e, 0x79622d32, 0x6b206574]; // "expand 32-byte k"

function rotl(x, n) {
  return (x << n) | (x >>> (32 - n));
}

// The Salsa20 state for a 32-byte key and 16 bytes of input, after 20 rounds.
function rounds(key, input) {
  const k = (i) => key.readUInt32LE(i * 4);
  const n = (i) => input.readUInt32LE(i * 4);
  const j = [SIGMA[0], k(0), k(1), k(2), k(3), SIGMA[1], n(0), n(1), n(2), n(3), SIGMA[2], k(4), k(5), k(6), k(7), SIGMA[3]];
  const x = j.slice();
  const qr = (a, b, c, d) => {
    x[b] ^= rotl((x[a] + x[d]) | 0, 7);
    x[c] ^= rotl((x[b] + x[a]) | 0, 9);
    x[d] ^= rotl((x[c] + x[b]) | 0, 13);
    x[a] ^= rotl((x[d] + x[c]) | 0, 18);
  };
  for (let i = 0; i < 10; i++) {
    qr(0, 4, 8, 12); qr(5, 9, 13, 1); qr(10, 14, 2, 6); qr(15, 3, 7, 11); // columns
    qr(0, 1, 2, 3); qr(5, 6, 7, 4); qr(10, 11, 8, 9); qr(15, 12, 13, 14); // rows
  }
  return { x, j };
}

export function hsalsa20(key, nonce16) {
  const { x } = rounds(key, nonce16);
  const out = Buffer.alloc(32);
  [0, 5, 10, 15, 6, 7, 8, 9].forEach((w, i) => out.writeUInt32LE(x[w] >>> 0, i * 4));
  return out;
}

// `length` bytes of the XSalsa20 key stream for a 24-byte nonce.
function xsalsa20Stream(key, nonce24, length) {
  const subkey = hsalsa20(key, nonce24.subarray(0, 16));
  const input = Buffer.alloc(16);
  nonce24.copy(input, 0, 16, 24);
  const out = Buffer.alloc(Math.ceil(length / 64) * 64);
  for (let block = 0; block * 64 < length; block++) {
    input.writeBigUInt64LE(BigInt(block), 8);
    const { x, j } = rounds(subkey, input);
    for (let i = 0; i < 16; i++) out.writeUInt32LE((x[i] + j[i]) >>> 0, block * 64 + i * 4);
  }
  return out.subarray(0, length);
}

// --- Poly1305 (BigInt: slow, plain, enough for request-sized messages) --------------

const P1305 = (1n << 130n) - 5n;
const CLAMP = 0x0ffffffc0ffffffc0ffffffc0fffffffn;
const MASK128 = (1n << 128n) - 1n;

function le(bytes) {
  let v = 0n;
  for (let i = bytes.length - 1; i >= 0; i--) v = (v << 8n) | BigInt(bytes[i]);
  return v;
}

export function poly1305(message, key) {
  const r = le(key.subarray(0, 16)) & CLAMP;
  const s = le(key.subarray(16, 32));
  let acc = 0n;
  for (let i = 0; i < message.length; i += 16) {
    const block = message.subarray(i, i + 16);
    acc = ((acc + le(block) + (1n << BigInt(8 * block.length))) * r) % P1305;
  }
  acc = (acc + s) & MASK128;
  const tag = Buffer.alloc(16);
  tag.writeBigUInt64LE(acc & 0xffffffffffffffffn, 0);
  tag.writeBigUInt64LE(acc >> 64n, 8);
  return tag;
}

// --- crypto_box ---------------------------------------------------------------------

const PKCS8_X25519 = Buffer.from("302e020100300506032b656e04220420", "hex");
const SPKI_X25519 = Buffer.from("302a300506032b656e032100", "hex");

export function keyPair() {
  const { publicKey, privateKey } = crypto.generateKeyPairSync("x25519");
  return {
    publicKey: publicKey.export({ format: "der", type: "spki" }).subarray(SPKI_X25519.length),
    secretKey: privateKey.export({ format: "der", type: "pkcs8" }).subarray(PKCS8_X25519.length),
  };
}

// crypto_box_beforenm: the key two parties share, HSalsa20 over X25519's output.
export function boxKey(theirPublic, mySecret) {
  const shared = crypto.diffieHellman({
    privateKey: crypto.createPrivateKey({ key: Buffer.concat([PKCS8_X25519, mySecret]), format: "der", type: "pkcs8" }),
    publicKey: crypto.createPublicKey({ key: Buffer.concat([SPKI_X25519, theirPublic]), format: "der", type: "spki" }),
  });
  return hsalsa20(shared, Buffer.alloc(16));
}

// crypto_box_afternm without NaCl's zero padding: 16-byte MAC, then the ciphertext.
export function seal(message, nonce24, key) {
  const stream = xsalsa20Stream(key, nonce24, 32 + message.length);
  const cipher = Buffer.alloc(message.length);
  for (let i = 0; i < message.length; i++) cipher[i] = message[i] ^ stream[32 + i];
  return Buffer.concat([poly1305(cipher, stream.subarray(0, 32)), cipher]);
}

// crypto_box_open_afternm: the message, or an exception when the MAC does not hold.
export function open(box, nonce24, key) {
  if (box.length < 16) throw new Error("CURVE box too short");
  const cipher = box.subarray(16);
  const stream = xsalsa20Stream(key, nonce24, 32 + cipher.length);
  if (!crypto.timingSafeEqual(poly1305(cipher, stream.subarray(0, 32)), box.subarray(0, 16))) {
    throw new Error("CURVE box does not authenticate");
  }
  const message = Buffer.alloc(cipher.length);
  for (let i = 0; i < cipher.length; i++) message[i] = cipher[i] ^ stream[32 + i];
  return message;
}

// --- the CURVE handshake, client side ----------------------------------------------

function nonce(prefix, tail) {
  return Buffer.concat([Buffer.from(prefix, "ascii"), tail]);
}

function u64(n) {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}

// ZMTP metadata: name length (1 byte), name, value length (4 bytes), value.
export function metadata(props) {
  return Buffer.concat(
    Object.entries(props).map(([name, value]) => {
      const v = Buffer.from(value);
      const len = Buffer.alloc(4);
      len.writeUInt32BE(v.length);
      return Buffer.concat([Buffer.from([name.length]), Buffer.from(name), len, v]);
    }),
  );
}

export class CurveClient {
  // keys: {publicKey, secretKey, serverKey}, each 32 bytes.
  constructor({ publicKey, secretKey, serverKey }) {
    this.C = publicKey;
    this.c = secretKey;
    this.S = serverKey;
    const ephemeral = keyPair();
    this.Cn = ephemeral.publicKey;
    this.cn = ephemeral.secretKey;
    this.nonce = 1n; // our short nonces: 1 for HELLO, 2 for INITIATE, then messages
    this.peerNonce = 0n;
  }

  #next() {
    return u64(this.nonce++);
  }

  hello() {
    const short = this.#next();
    const box = seal(Buffer.alloc(64), nonce("CurveZMQHELLO---", short), boxKey(this.S, this.cn));
    return Buffer.concat([Buffer.from("\x05HELLO"), Buffer.from([1, 0]), Buffer.alloc(72), this.Cn, short, box]);
  }

  // WELCOME -> the INITIATE command to answer with.
  welcome(body, props) {
    if (body.length !== 168 || body.subarray(0, 8).toString("latin1") !== "\x07WELCOME") {
      throw new Error("CURVE: expected WELCOME");
    }
    const plain = open(body.subarray(24), nonce("WELCOME-", body.subarray(8, 24)), boxKey(this.S, this.cn));
    const Sn = plain.subarray(0, 32);
    const cookie = plain.subarray(32, 128);
    this.key = boxKey(Sn, this.cn);
    const vouchNonce = crypto.randomBytes(16);
    const vouch = seal(Buffer.concat([this.Cn, this.S]), nonce("VOUCH---", vouchNonce), boxKey(Sn, this.c));
    const short = this.#next();
    const box = seal(
      Buffer.concat([this.C, vouchNonce, vouch, metadata(props)]),
      nonce("CurveZMQINITIATE", short),
      this.key,
    );
    return Buffer.concat([Buffer.from("\x08INITIATE"), cookie, short, box]);
  }

  // READY -> the server's metadata (raw).
  ready(body) {
    if (body.subarray(0, 6).toString("latin1") !== "\x05READY") throw new Error("CURVE: expected READY");
    const short = body.subarray(6, 14);
    this.peerNonce = short.readBigUInt64BE();
    return open(body.subarray(14), nonce("CurveZMQREADY---", short), this.key);
  }

  // One ZMTP frame (flags: 1 more, 2 command) -> a MESSAGE body.
  encrypt(payload, flags = 0) {
    const short = this.#next();
    const box = seal(Buffer.concat([Buffer.from([flags]), payload]), nonce("CurveZMQMESSAGEC", short), this.key);
    return Buffer.concat([Buffer.from("\x07MESSAGE"), short, box]);
  }

  // A MESSAGE body -> {flags, payload}.
  decrypt(body) {
    if (body.subarray(0, 8).toString("latin1") !== "\x07MESSAGE") throw new Error("CURVE: expected MESSAGE");
    const short = body.subarray(8, 16);
    const n = short.readBigUInt64BE();
    if (n <= this.peerNonce) throw new Error("CURVE: message nonce out of sequence");
    this.peerNonce = n;
    const plain = open(body.subarray(16), nonce("CurveZMQMESSAGES", short), this.key);
    return { flags: plain[0], payload: plain.subarray(1) };
  }
}
