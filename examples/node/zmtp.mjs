// A DEALER socket speaking ZMTP 3.0 over a unix socket or tcp, in plain Node.js with
// no dependency: the NULL mechanism for a Sensorium node's ipc endpoint, CURVE
// (curve.mjs) for a tcp one. A production client would use the `zeromq` package
// (libzmq: reconnects, heartbeats); this file shows how little the wire needs.
// RFCs: rfc.zeromq.org/spec/23 (ZMTP 3.0), /25 (ZMTP-CURVE), /26 (CurveZMQ).
import net from "node:net";
import { CurveClient } from "./curve.mjs";

const SIGNATURE = Buffer.from([0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f]);

function greeting(mechanism) {
  const g = Buffer.alloc(64);
  SIGNATURE.copy(g, 0);
  g[10] = 3; // version 3.0
  g[11] = 0;
  g.write(mechanism, 12, "ascii"); // "NULL" or "CURVE", zero-padded to 20 bytes
  g[32] = 0; // as-server: no
  return g;
}

function frame(body, { more = false, command = false } = {}) {
  const flags = (more ? 1 : 0) | (command ? 4 : 0);
  if (body.length < 256) return Buffer.concat([Buffer.from([flags, body.length]), body]);
  const head = Buffer.alloc(9);
  head[0] = flags | 2; // long frame
  head.writeBigUInt64BE(BigInt(body.length), 1);
  return Buffer.concat([head, body]);
}

function ready(socketType) {
  const name = Buffer.from("Socket-Type");
  const value = Buffer.from(socketType);
  const len = Buffer.alloc(4);
  len.writeUInt32BE(value.length);
  const body = Buffer.concat([Buffer.from([5]), Buffer.from("READY"), Buffer.from([name.length]), name, len, value]);
  return frame(body, { command: true });
}

export class Dealer {
  // target: {path} for a unix socket (ipc://PATH), or {host, port} for tcp.
  // curve: {publicKey, secretKey, serverKey} (32 bytes each) for a CURVE endpoint.
  static connect(target, { curve = null } = {}) {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection(target);
      const d = new Dealer(sock, curve);
      d.onReady = () => {
        d.onFail = null;
        resolve(d);
      };
      d.onFail = reject;
      sock.once("connect", () => {
        sock.write(greeting(curve ? "CURVE" : "NULL"));
        // Both greetings may cross: the first command follows ours at once.
        sock.write(curve ? frame(d.curve.hello(), { command: true }) : ready("DEALER"));
      });
    });
  }

  constructor(sock, curve = null) {
    this.sock = sock;
    this.curve = curve ? new CurveClient(curve) : null;
    this.buf = Buffer.alloc(0);
    this.greeted = false;
    this.ready = false;
    this.parts = [];
    this.waiting = [];
    this.queue = [];
    sock.on("data", (chunk) => {
      try {
        this.#feed(chunk);
      } catch (e) {
        this.#fail(e);
      }
    });
    sock.on("error", (e) => this.#fail(e));
    sock.on("close", () =>
      this.#fail(
        new Error(
          this.ready || !this.curve
            ? "connection closed by the node"
            : "the node closed the connection during the CURVE handshake: is server-public-key the node's key?",
        ),
      ),
    );
  }

  #fail(error) {
    if (this.failed) return;
    this.failed = error;
    this.sock.destroy();
    if (this.onFail) this.onFail(error);
    for (const w of this.waiting.splice(0)) w(null, error);
  }

  #feed(chunk) {
    this.buf = Buffer.concat([this.buf, chunk]);
    if (!this.greeted) {
      if (this.buf.length < 64) return;
      if (this.buf[0] !== 0xff || this.buf[9] !== 0x7f) throw new Error("not a ZMTP peer");
      this.buf = this.buf.subarray(64);
      this.greeted = true;
    }
    for (;;) {
      if (this.buf.length < 2) return;
      const flags = this.buf[0];
      let size, start;
      if (flags & 2) {
        if (this.buf.length < 9) return;
        size = Number(this.buf.readBigUInt64BE(1));
        start = 9;
      } else {
        size = this.buf[1];
        start = 2;
      }
      if (this.buf.length < start + size) return;
      const body = Buffer.from(this.buf.subarray(start, start + size));
      this.buf = this.buf.subarray(start + size);
      if (flags & 4) this.#command(body);
      else if (this.curve) {
        // Every frame after a CURVE handshake is a MESSAGE box holding the real flags.
        const inner = this.curve.decrypt(body);
        if (!(inner.flags & 2)) this.#part(inner.payload, inner.flags & 1);
      } else this.#part(body, flags & 1);
    }
  }

  #command(body) {
    const name = body.subarray(1, 1 + body[0]).toString();
    if (name === "ERROR") throw new Error(`refused by the node: ${body.subarray(7).toString()}`);
    if (this.curve && name === "WELCOME") {
      this.sock.write(frame(this.curve.welcome(body, { "Socket-Type": "DEALER" }), { command: true }));
    } else if (name === "READY" && !this.ready) {
      if (this.curve) this.curve.ready(body);
      this.ready = true;
      if (this.onReady) this.onReady();
    }
    // Anything else (PING, when a peer asks for heartbeats) needs no answer here.
  }

  #part(body, more) {
    this.parts.push(body);
    if (more) return;
    const message = this.parts;
    this.parts = [];
    const w = this.waiting.shift();
    if (w) w(message);
    else this.queue.push(message);
  }

  send(parts) {
    if (this.failed) throw this.failed;
    parts.forEach((p, i) => {
      const more = i < parts.length - 1;
      // CURVE: the MORE flag travels inside the box; the outer frame carries none.
      this.sock.write(this.curve ? frame(this.curve.encrypt(p, more ? 1 : 0)) : frame(p, { more }));
    });
  }

  recv(timeoutMs) {
    if (this.queue.length) return Promise.resolve(this.queue.shift());
    if (this.failed) return Promise.reject(this.failed);
    return new Promise((resolve, reject) => {
      const waiter = (m, error) => {
        clearTimeout(timer);
        if (error) reject(error);
        else resolve(m);
      };
      const timer = setTimeout(() => {
        this.waiting = this.waiting.filter((w) => w !== waiter); // nobody to hand it to
        reject(new Error("reply-timeout"));
      }, timeoutMs);
      this.waiting.push(waiter);
    });
  }

  close() {
    this.onFail = null;
    this.failed = this.failed || new Error("closed");
    this.sock.destroy();
  }
}
