// A minimal MessagePack codec (the subset JSON values need, plus bin and timestamps),
// so the example runs with Node.js alone. With npm at hand, @msgpack/msgpack does the
// same; the node accepts what either sends (docs/wire-protocol.md, "Encoding rules").

export function encode(value) {
  const out = [];
  write(value, out);
  return Buffer.concat(out);
}

function u8(...bytes) {
  return Buffer.from(bytes);
}

function write(v, out) {
  if (v === null || v === undefined) out.push(u8(0xc0));
  else if (v === true) out.push(u8(0xc3));
  else if (v === false) out.push(u8(0xc2));
  else if (typeof v === "number") writeNumber(v, out);
  else if (typeof v === "string") {
    const b = Buffer.from(v, "utf8");
    if (b.length < 32) out.push(u8(0xa0 | b.length));
    else if (b.length < 256) out.push(u8(0xd9, b.length));
    else if (b.length < 65536) out.push(u8(0xda, b.length >> 8, b.length & 0xff));
    else {
      const h = Buffer.alloc(5);
      h[0] = 0xdb;
      h.writeUInt32BE(b.length, 1);
      out.push(h);
    }
    out.push(b);
  } else if (Buffer.isBuffer(v)) {
    const h = Buffer.alloc(5);
    h[0] = 0xc6;
    h.writeUInt32BE(v.length, 1);
    out.push(h, v);
  } else if (Array.isArray(v)) {
    header(v.length, 0x90, 0xdc, out);
    v.forEach((x) => write(x, out));
  } else if (typeof v === "object") {
    const keys = Object.keys(v).filter((k) => v[k] !== undefined);
    header(keys.length, 0x80, 0xde, out);
    for (const k of keys) {
      write(k, out);
      write(v[k], out);
    }
  } else throw new TypeError(`cannot encode ${typeof v}`);
}

function header(n, fix, big, out) {
  if (n < 16) out.push(u8(fix | n));
  else {
    const h = Buffer.alloc(5);
    h[0] = big + 1; // 0xdd / 0xdf: the 32-bit forms
    h.writeUInt32BE(n, 1);
    out.push(h);
  }
}

function writeNumber(n, out) {
  if (Number.isInteger(n) && n >= 0 && n < 128) out.push(u8(n));
  else if (Number.isInteger(n) && n < 0 && n >= -32) out.push(u8(n & 0xff));
  else if (Number.isSafeInteger(n)) {
    const b = Buffer.alloc(9);
    b[0] = n < 0 ? 0xd3 : 0xcf;
    if (n < 0) b.writeBigInt64BE(BigInt(n), 1);
    else b.writeBigUInt64BE(BigInt(n), 1);
    out.push(b);
  } else {
    const b = Buffer.alloc(9);
    b[0] = 0xcb;
    b.writeDoubleBE(n, 1);
    out.push(b);
  }
}

export function decode(buf) {
  const [value, end] = read(buf, 0);
  if (end !== buf.length) throw new Error("trailing bytes");
  return value;
}

function read(b, i) {
  const t = b[i];
  if (t < 0x80) return [t, i + 1];
  if (t >= 0xe0) return [t - 256, i + 1];
  if ((t & 0xf0) === 0x80) return map(b, i + 1, t & 0x0f);
  if ((t & 0xf0) === 0x90) return arr(b, i + 1, t & 0x0f);
  if ((t & 0xe0) === 0xa0) return str(b, i + 1, t & 0x1f);
  switch (t) {
    case 0xc0: return [null, i + 1];
    case 0xc2: return [false, i + 1];
    case 0xc3: return [true, i + 1];
    case 0xc4: return bin(b, i + 2, b[i + 1]);
    case 0xc5: return bin(b, i + 3, b.readUInt16BE(i + 1));
    case 0xc6: return bin(b, i + 5, b.readUInt32BE(i + 1));
    case 0xca: return [b.readFloatBE(i + 1), i + 5];
    case 0xcb: return [b.readDoubleBE(i + 1), i + 9];
    case 0xcc: return [b[i + 1], i + 2];
    case 0xcd: return [b.readUInt16BE(i + 1), i + 3];
    case 0xce: return [b.readUInt32BE(i + 1), i + 5];
    case 0xcf: return [Number(b.readBigUInt64BE(i + 1)), i + 9];
    case 0xd0: return [b.readInt8(i + 1), i + 2];
    case 0xd1: return [b.readInt16BE(i + 1), i + 3];
    case 0xd2: return [b.readInt32BE(i + 1), i + 5];
    case 0xd3: return [Number(b.readBigInt64BE(i + 1)), i + 9];
    case 0xd9: return str(b, i + 2, b[i + 1]);
    case 0xda: return str(b, i + 3, b.readUInt16BE(i + 1));
    case 0xdb: return str(b, i + 5, b.readUInt32BE(i + 1));
    case 0xdc: return arr(b, i + 3, b.readUInt16BE(i + 1));
    case 0xdd: return arr(b, i + 5, b.readUInt32BE(i + 1));
    case 0xde: return map(b, i + 3, b.readUInt16BE(i + 1));
    case 0xdf: return map(b, i + 5, b.readUInt32BE(i + 1));
    default: throw new Error(`MessagePack type 0x${t.toString(16)} is not used by Sensorium`);
  }
}

function str(b, i, n) {
  return [b.toString("utf8", i, i + n), i + n];
}

function bin(b, i, n) {
  return [Buffer.from(b.subarray(i, i + n)), i + n];
}

function arr(b, i, n) {
  const out = [];
  for (let k = 0; k < n; k++) {
    const [v, j] = read(b, i);
    out.push(v);
    i = j;
  }
  return [out, i];
}

function map(b, i, n) {
  const out = {};
  for (let k = 0; k < n; k++) {
    const [key, j] = read(b, i);
    const [v, m] = read(b, j);
    out[key] = v;
    i = m;
  }
  return [out, i];
}
