// mqtt.js (the npm `mqtt` package) against Portico's broker, run by tests/mqtt_clients.rs:
//   node mqtt_js_client.js MQTT_MODULE_DIR URL VERSION TAG
// URL is mqtt://host:port or ws://host:port/mqtt; VERSION 3 (MQTT 3.1), 4 (3.1.1) or 5. Prints `ok ...` per
// check and `done` at the end; exits 1 with `FAILED: ...` on the first failure or after 20 s.
// With a sixth argument `will-child`, it only connects with a will, says `connected`, and waits to be killed.
"use strict";
const [moduleDir, url, versionText, tag, mode] = process.argv.slice(2);
const mqtt = require(moduleDir);
const { spawn } = require("child_process");
const version = Number(versionText);

let step = "start";
const fail = (what) => {
  console.log(`FAILED: ${what}`);
  process.exit(1);
};
const timer = setTimeout(() => fail(`timed out at: ${step}`), 20000);
const check = (ok, what) => {
  if (!ok) fail(what);
};

function connect(clientId, extra = {}) {
  const options = { protocolVersion: version, clientId, reconnectPeriod: 0, connectTimeout: 5000, ...extra };
  if (version === 3) options.protocolId = "MQIsdp"; // MQTT 3.1; over WebSocket its subprotocol is mqttv3.1
  return new Promise((resolve, reject) => {
    const client = mqtt.connect(url, options);
    client.once("connect", () => resolve(client));
    client.once("error", reject);
  });
}

// The next message on `topic` that `client` receives.
function next(client, topic) {
  return new Promise((resolve) => {
    const handler = (t, payload, packet) => {
      if (t === topic) {
        client.removeListener("message", handler);
        resolve({ payload: payload.toString(), packet });
      }
    };
    client.on("message", handler);
  });
}

async function willChild() {
  await connect(`${tag}-will`, { will: { topic: `${tag}/will`, payload: "gone", qos: 1, retain: false } });
  console.log("connected");
  setInterval(() => {}, 1000);
}

async function main() {
  step = "connect";
  const sub = await connect(`${tag}-sub`);
  const pub = await connect(`${tag}-pub`);
  step = "subscribe";
  const granted = await sub.subscribeAsync(`${tag}/#`, { qos: 2 });
  check(granted[0].qos === 2, `granted ${JSON.stringify(granted)}`);
  for (const qos of [0, 1, 2]) {
    step = `publish at QoS ${qos}`;
    const got = next(sub, `${tag}/q${qos}`);
    await pub.publishAsync(`${tag}/q${qos}`, `at ${qos}`, { qos });
    const m = await got;
    check(m.payload === `at ${qos}` && m.packet.qos === qos, `${step}: got ${m.payload} at ${m.packet.qos}`);
    console.log(`ok QoS ${qos}`);
  }

  step = "retained message";
  await pub.publishAsync(`${tag}-retained`, "kept", { qos: 1, retain: true });
  const late = await connect(`${tag}-late`);
  const retained = next(late, `${tag}-retained`);
  await late.subscribeAsync(`${tag}-retained`, { qos: 1 });
  const r = await retained;
  check(r.payload === "kept" && r.packet.retain === true, `${step}: ${r.payload} retain=${r.packet.retain}`);
  await pub.publishAsync(`${tag}-retained`, "", { qos: 1, retain: true }); // cleared
  console.log("ok retained");

  step = "will on an abrupt close";
  const will = next(sub, `${tag}/will`);
  const child = spawn(process.execPath, [__filename, moduleDir, url, versionText, tag, "will-child"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise((resolve) => child.stdout.on("data", (d) => d.toString().includes("connected") && resolve()));
  child.kill("SIGKILL");
  const w = await will;
  check(w.payload === "gone", `${step}: ${w.payload}`);
  console.log("ok will");

  if (version === 5) {
    step = "user properties";
    const userProperties = { sensor: "kitchen", unit: ["celsius", "rounded"] };
    const got = next(sub, `${tag}/props`);
    const properties = { userProperties, contentType: "text/plain", correlationData: Buffer.from("c-1") };
    await pub.publishAsync(`${tag}/props`, "21.5", { qos: 1, properties });
    const m = await got;
    const p = m.packet.properties || {};
    check(
      JSON.stringify(p.userProperties) === JSON.stringify(userProperties) &&
        p.contentType === "text/plain" &&
        Buffer.from(p.correlationData || []).toString() === "c-1",
      `${step}: ${JSON.stringify(p)}`,
    );
    console.log("ok user properties");
  }

  step = "disconnect";
  await Promise.all([sub.endAsync(), pub.endAsync(), late.endAsync()]);
  clearTimeout(timer);
  console.log("done");
  process.exit(0);
}

(mode === "will-child" ? willChild() : main()).catch((e) => fail(`${step}: ${e && e.stack ? e.stack : e}`));
