// A Sensorium client in Node.js, written from docs/wire-protocol.md and schemas/ alone.
//
//   node examples/node/client.mjs [STATE_DIR]                        # ipc
//   node examples/node/client.mjs tcp://HOST:PORT NAME.key_secret     # tcp + CURVE
//
// Connects to the node's ipc endpoint (STATE_DIR, else $SENSORIUM_STATE_DIR, else
// ~/.local/state/sensorium), or to a tcp endpoint with the client certificate
// `sensorium keys client add NAME` issued; then: lists the actions it may invoke, runs
// one sync directive, runs one deferred and waits for it, and sends one the node
// refuses. Prints one JSON line per step. Zero dependencies (zmtp.mjs, curve.mjs,
// msgpack.mjs).
import { randomUUID } from "node:crypto";
import os from "node:os";
import path from "node:path";
import { readCert } from "./curve.mjs";
import { decode, encode } from "./msgpack.mjs";
import { Dealer } from "./zmtp.mjs";

const MARGIN_MS = 15000; // limits.reply_margin_ms: size reply timeouts above the action's

export class Sensorium {
  static async open(stateDir) {
    const dealer = await Dealer.connect({ path: path.join(stateDir, "run", "core.sock") });
    return new Sensorium(dealer, "example.node");
  }

  // endpoint: "tcp://HOST:PORT"; keyFile: the zcert file `sensorium keys client add`
  // wrote (it names the server's key too). Over CURVE a key may claim as issuer only
  // the modules it is bound to, else its own name: the certificate's `name`.
  static async openCurve(endpoint, keyFile, moduleId = null) {
    const m = /^tcp:\/\/(.+):(\d+)$/.exec(endpoint);
    if (!m) throw new Error(`${endpoint}: expected tcp://HOST:PORT`);
    const cert = readCert(keyFile);
    if (!cert.serverKey) throw new Error(`${keyFile} does not name server-public-key`);
    const dealer = await Dealer.connect(
      { host: m[1].replace(/^\[|\]$/g, ""), port: Number(m[2]) },
      { curve: { publicKey: cert.publicKey, secretKey: cert.secretKey, serverKey: cert.serverKey } },
    );
    return new Sensorium(dealer, moduleId || cert.metadata.name);
  }

  constructor(dealer, moduleId) {
    this.dealer = dealer;
    this.moduleId = moduleId;
  }

  async call(method, fields = {}, timeoutMs = 10000) {
    const request = { method, "request/id": randomUUID(), ...fields };
    this.dealer.send([encode(request)]);
    for (;;) {
      const [body] = await this.dealer.recv(timeoutMs);
      const reply = decode(body);
      if (reply["request/id"] !== request["request/id"]) continue; // a late one
      if (!reply.ok) {
        const e = reply.error;
        throw Object.assign(new Error(`${e.code}: ${e.message}`), { code: e.code, reply });
      }
      return reply.result;
    }
  }

  invoke(actionId, parameters, { mode = "sync", timeoutMs = 10000 } = {}) {
    const directive = {
      schema: "sensorium-directive.v1",
      "schema/v": 1,
      "directive/id": randomUUID(),
      "directive/issued_at": new Date().toISOString(),
      issuer: { module_id: this.moduleId },
      action_id: actionId,
      parameters,
      timing: { mode, timeout_ms: timeoutMs },
    };
    return this.call("sensorium.directive.invoke", { directive }, timeoutMs + MARGIN_MS);
  }

  // Polls a deferred operation until it ends, waiting as long as the node suggests.
  async wait(operationId, maxPolls = 600) {
    for (let i = 0; i < maxPolls; i++) {
      const status = await this.call("sensorium.operation.status", { "operation/id": operationId });
      if (!["pending", "running"].includes(status.status)) return status;
      const pause = Math.min(Number(status.retry_after_seconds ?? 1), 2) * 1000;
      await new Promise((r) => setTimeout(r, pause));
    }
    throw new Error(`${operationId} did not end within ${maxPolls} polls`);
  }

  close() {
    this.dealer.close();
  }
}

async function main() {
  const [where, keyFile] = process.argv.slice(2);
  let node;
  if (where?.startsWith("tcp://")) {
    if (!keyFile) throw new Error("a tcp endpoint needs a client key file (NAME.key_secret)");
    node = await Sensorium.openCurve(where, keyFile);
  } else {
    node = await Sensorium.open(
      where || process.env.SENSORIUM_STATE_DIR || path.join(os.homedir(), ".local", "state", "sensorium"),
    );
  }
  const say = (step, fields) => console.log(JSON.stringify({ step, ...fields }));
  try {
    const health = await node.call("sensorium.health");
    say("health", { process: health.process, version: health.version });

    const list = await node.call("sensorium.directive.list");
    say("catalog", { actions: list.actions.map((a) => a.action_id) });

    const done = await node.invoke("demo.fs.stat", { path: "/" });
    say("invoke", { status: done.status, exit_code: done["sensorium/outcome"].exit_code, outcome: done["outcome/id"] });

    const admitted = await node.invoke("demo.fs.find-large", { path: "/etc", min_mib: 1 }, { mode: "async" });
    const handle = admitted["sensorium/deferred"];
    const final = await node.wait(handle["operation/id"]);
    say("async", { admitted: admitted.status, final: final.status });

    const refused = await node.invoke("demo.nope", {});
    say("refused", { status: refused.status, code: refused.diagnostics[0].code });
  } finally {
    node.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e) => {
    console.error(`example failed: ${e.message}`);
    process.exit(1);
  });
}
