// A Sensorium client in Node.js, written from docs/wire-protocol.md and schemas/ alone.
//
//   node examples/node/client.mjs [STATE_DIR]
//
// Connects to the node's ipc endpoint (STATE_DIR, else $SENSORIUM_STATE_DIR, else
// ~/.local/state/sensorium), then: lists the actions it may invoke, runs one sync
// directive, runs one deferred and waits for it, and sends one the node refuses.
// Prints one JSON line per step. Zero dependencies (zmtp.mjs, msgpack.mjs); a tcp
// endpoint needs CURVE, for which use the `zeromq` npm package instead of zmtp.mjs.
import { randomUUID } from "node:crypto";
import os from "node:os";
import path from "node:path";
import { decode, encode } from "./msgpack.mjs";
import { Dealer } from "./zmtp.mjs";

const MARGIN_MS = 15000; // limits.reply_margin_ms: size reply timeouts above the action's

export class Sensorium {
  static async open(stateDir) {
    const dealer = await Dealer.connect({ path: path.join(stateDir, "run", "core.sock") });
    return new Sensorium(dealer);
  }

  constructor(dealer) {
    this.dealer = dealer;
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
      issuer: { module_id: "example.node" },
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
  const stateDir =
    process.argv[2] ||
    process.env.SENSORIUM_STATE_DIR ||
    path.join(os.homedir(), ".local", "state", "sensorium");
  const node = await Sensorium.open(stateDir);
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
