// Syscall round-trip client in Node for `cargo bench -p keel-cli --bench syscall`: the
// same measurements as bench_client.py, through the TypeScript SDK.
//
// Modes:
//   echo PATH   raw JSON-RPC lines to an echo server at PATH (the Node floor)
//   kernel      under `keel run`: sys.ping round trips through the SDK (`require("keel")`
//               from the NODE_PATH keel run sets); reports them through run.exit
// Each mode prints one JSON object of latency stats (microseconds).
"use strict";

const net = require("node:net");

const N = Number(process.env.BENCH_N ?? "20000");
const WARMUP = 1000;

function stats(samples) {
  samples.sort((a, b) => a - b);
  const n = samples.length;
  const round = (x) => Math.round(x * 10) / 10;
  return {
    n,
    mean_us: round(samples.reduce((sum, x) => sum + x, 0) / n),
    p50_us: round(samples[Math.floor(n / 2)]),
    p99_us: round(samples[Math.min(n - 1, Math.floor(n * 0.99))]),
  };
}

function microseconds(start) {
  return Number(process.hrtime.bigint() - start) / 1000;
}

/** One request line at a time over a raw socket, as plainly as Node allows. */
async function echoRoundTrips(path) {
  const socket = net.createConnection({ path });
  await new Promise((resolve) => socket.once("connect", resolve));
  let buffered = "";
  let waiting = null;
  socket.setEncoding("utf8");
  socket.on("data", (chunk) => {
    buffered += chunk;
    const newline = buffered.indexOf("\n");
    if (newline >= 0 && waiting) {
      const line = buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
      const resolve = waiting;
      waiting = null;
      resolve(line);
    }
  });
  const samples = [];
  for (let i = 0; i < N + WARMUP; i++) {
    const start = process.hrtime.bigint();
    const reply = new Promise((resolve) => (waiting = resolve));
    socket.write(JSON.stringify({ jsonrpc: "2.0", id: i + 1, method: "sys.ping", params: {} }) + "\n");
    const line = await reply;
    if (JSON.parse(line).id !== i + 1) throw new Error(`bad reply ${line}`);
    if (i >= WARMUP) samples.push(microseconds(start));
  }
  socket.destroy();
  return stats(samples);
}

async function main() {
  const mode = process.argv[2];
  if (mode === "echo") {
    console.log(JSON.stringify({ echo: await echoRoundTrips(process.argv[3]) }));
    return;
  }
  const k = await require("keel").connect();
  const samples = [];
  for (let i = 0; i < N + WARMUP; i++) {
    const start = process.hrtime.bigint();
    await k.ping();
    if (i >= WARMUP) samples.push(microseconds(start));
  }
  const result = { kernel_sdk: stats(samples) };
  await k.exit(result);
  console.log(JSON.stringify(result));
}

main().catch((err) => {
  console.error(String(err));
  process.exit(1);
});
