// A DEALER socket speaking ZMTP 3.0 (NULL mechanism) over a unix socket or tcp, in
// plain Node.js with no dependency: enough for a Sensorium node's ipc endpoint.
// A production client would use the `zeromq` package (libzmq: reconnects, CURVE for
// tcp endpoints); this file shows how little the wire needs. RFC: rfc.zeromq.org/spec/23
import net from "node:net";

const SIGNATURE = Buffer.from([0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f]);

function greeting() {
  const g = Buffer.alloc(64);
  SIGNATURE.copy(g, 0);
  g[10] = 3; // version 3.0
  g[11] = 0;
  g.write("NULL", 12, "ascii"); // mechanism, zero-padded to 20 bytes
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
  // path: a unix socket path (ipc://PATH) or {host, port}.
  static connect(target) {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection(target);
      const d = new Dealer(sock);
      sock.once("error", reject);
      sock.once("connect", () => {
        sock.write(greeting());
        sock.write(ready("DEALER"));
      });
      d.onReady = () => {
        sock.off("error", reject);
        resolve(d);
      };
    });
  }

  constructor(sock) {
    this.sock = sock;
    this.buf = Buffer.alloc(0);
    this.greeted = false;
    this.parts = [];
    this.waiting = [];
    this.queue = [];
    sock.on("data", (chunk) => this.#feed(chunk));
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
      const body = this.buf.subarray(start, start + size);
      this.buf = this.buf.subarray(start + size);
      if (flags & 4) {
        // A command: the peer's READY (or an ERROR) before any message.
        const name = body.subarray(1, 1 + body[0]).toString();
        if (name === "READY" && this.onReady) this.onReady();
        if (name === "ERROR") throw new Error(`ZMTP error: ${body.subarray(7).toString()}`);
        continue;
      }
      this.parts.push(Buffer.from(body));
      if (!(flags & 1)) {
        const message = this.parts;
        this.parts = [];
        const w = this.waiting.shift();
        if (w) w(message);
        else this.queue.push(message);
      }
    }
  }

  send(parts) {
    parts.forEach((p, i) => this.sock.write(frame(p, { more: i < parts.length - 1 })));
  }

  recv(timeoutMs) {
    if (this.queue.length) return Promise.resolve(this.queue.shift());
    return new Promise((resolve, reject) => {
      const waiter = (m) => {
        clearTimeout(timer);
        resolve(m);
      };
      const timer = setTimeout(() => {
        this.waiting = this.waiting.filter((w) => w !== waiter); // nobody to hand it to
        reject(new Error("reply-timeout"));
      }, timeoutMs);
      this.waiting.push(waiter);
    });
  }

  close() {
    this.sock.destroy();
  }
}
