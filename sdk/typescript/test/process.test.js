// The package as agents load it: real `node` processes finding `keel` through NODE_PATH
// (as `keel run` sets it), from CommonJS and from ESM, and a connection that does not
// keep a finished program alive.
"use strict";

const assert = require("node:assert/strict");
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { test, after } = require("node:test");

const { SDK_DIR, helloKernel } = require("./fake_kernel.js");

// A directory laid out as the kernel unpacks the SDK: `<dir>/keel/package.json`.
const nodePath = fs.mkdtempSync(path.join(os.tmpdir(), "keel-node-path-"));
fs.symlinkSync(SDK_DIR, path.join(nodePath, "keel"));
after(() => fs.rmSync(nodePath, { recursive: true, force: true }));

/** Runs `node` with `args` (a script in `cwd` if given) under the fake kernel's env. */
function runNode(args, { env = {}, cwd = os.tmpdir() } = {}) {
  const child = spawn(process.execPath, args, {
    cwd,
    env: { PATH: process.env.PATH, NODE_PATH: nodePath, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk) => (stdout += chunk));
  child.stderr.on("data", (chunk) => (stderr += chunk));
  const done = new Promise((resolve) => child.on("close", (code) => resolve({ code, stdout, stderr })));
  return { child, done };
}

function script(name, text) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-agent-"));
  const file = path.join(dir, name);
  fs.writeFileSync(file, text);
  return { dir, file, cleanup: () => fs.rmSync(dir, { recursive: true, force: true }) };
}

/** A kernel answering `sys.now` with 42 and recording the methods it was asked. */
async function nowKernel(methods = []) {
  return helloKernel(async (conn) => {
    for (let request; (request = await conn.read()) !== null; ) {
      methods.push(request.method);
      conn.answer(request, request.method === "sys.now" ? { unix_ms: 42 } : {});
    }
  });
}

test("require('keel') resolves through NODE_PATH and a program ends without close()", { timeout: 60_000 }, async () => {
  const methods = [];
  const kernel = await nowKernel(methods);
  const agent = script(
    "agent.js",
    `const keel = require("keel");
     (async () => {
       const k = await keel.connect();
       console.log(k.runId, await k.nowMs());
       await k.exit({ ok: true }); // and no close(): the idle connection must not hold the process
     })();`,
  );
  try {
    const { done } = runNode([agent.file], { env: kernel.env() });
    const { code, stdout, stderr } = await done;
    assert.equal(code, 0, stderr);
    assert.equal(stdout.trim(), "run_1 42");
    assert.deepEqual(methods, ["sys.now", "run.exit"]);
  } finally {
    agent.cleanup();
    await kernel.close();
  }
});

test("a call in flight keeps the process alive until it is answered", { timeout: 60_000 }, async () => {
  let answerNow;
  const asked = new Promise((resolve) => (answerNow = resolve));
  const kernel = await helloKernel(async (conn) => {
    const request = await conn.read();
    const release = await asked; // the test decides when the answer comes
    conn.answer(request, { answer: release });
    await conn.readLine();
  });
  const agent = script(
    "agent.js",
    `require("keel").connect().then(async (k) => {
       console.log("asking");
       console.log("answer:", await k.ask("ready?"));
     });`,
  );
  try {
    const { child, done } = runNode([agent.file], { env: kernel.env() });
    await new Promise((resolve) => child.stdout.once("data", resolve));
    // The question is in flight; the process must still be there to hear the answer.
    assert.equal(child.exitCode, null);
    answerNow("yes");
    const { code, stdout, stderr } = await done;
    assert.equal(code, 0, stderr);
    assert.match(stdout, /answer: yes/);
  } finally {
    agent.cleanup();
    await kernel.close();
  }
});

test("an uncaught KeelError names the call, the kind and the code", { timeout: 60_000 }, async () => {
  const kernel = await helloKernel(async (conn) => {
    conn.fail(await conn.read(), 1001, "tool fs.write is not granted to this run", { kind: "denied" });
    await conn.readLine();
  });
  const agent = script("agent.js", `require("keel").connect().then((k) => k.tool("fs.write", { path: "x" }));`);
  try {
    const { code, stderr } = await runNode([agent.file], { env: kernel.env() }).done;
    assert.notEqual(code, 0);
    assert.match(stderr, /KeelError: tool\.call failed: tool fs\.write is not granted to this run \[denied, code 1001\]/);
  } finally {
    agent.cleanup();
    await kernel.close();
  }
});

test("outside keel run the program is told how to start", { timeout: 60_000 }, async () => {
  const agent = script("agent.js", `require("keel").connect();`);
  try {
    const { code, stderr } = await runNode([agent.file]).done;
    assert.notEqual(code, 0);
    assert.match(stderr, /NotUnderKeel: not running under Keel: start this program with `keel run -- node your_agent\.js` \(KEEL_SOCKET is not set\)/);
  } finally {
    agent.cleanup();
  }
});

test("ESM agents under NODE_PATH load the SDK with createRequire", { timeout: 60_000 }, async () => {
  const methods = [];
  const kernel = await nowKernel(methods);
  const agent = script(
    "agent.mjs",
    `import { createRequire } from "node:module";
     const require = createRequire(import.meta.url);
     const { connect } = require("keel");
     const k = await connect();
     console.log(await k.nowMs());`,
  );
  try {
    const { code, stdout, stderr } = await runNode([agent.file], { env: kernel.env() }).done;
    assert.equal(code, 0, stderr);
    assert.equal(stdout.trim(), "42");
    assert.deepEqual(methods, ["sys.now"]);
  } finally {
    agent.cleanup();
    await kernel.close();
  }
});

test("ESM import { connect } from 'keel' works where the package is in node_modules", { timeout: 60_000 }, async () => {
  const methods = [];
  const kernel = await nowKernel(methods);
  const agent = script(
    "agent.mjs",
    `import { connect, KeelError } from "keel";
     import * as keel from "keel";
     const cjs = (await import("node:module")).createRequire(import.meta.url)("keel");
     const k = await connect();
     console.log(JSON.stringify({
       now: await k.nowMs(),
       same: Object.keys(cjs).filter((name) => name !== "__esModule").every((name) => keel[name] === cjs[name]),
       error: typeof KeelError,
     }));`,
  );
  fs.mkdirSync(path.join(agent.dir, "node_modules"));
  fs.symlinkSync(SDK_DIR, path.join(agent.dir, "node_modules", "keel"));
  try {
    // No NODE_PATH: the package resolves as an installed dependency, through "exports".
    const { code, stdout, stderr } = await runNode([agent.file], { env: { ...kernel.env(), NODE_PATH: "" }, cwd: agent.dir }).done;
    assert.equal(code, 0, stderr);
    assert.deepEqual(JSON.parse(stdout), { now: 42, same: true, error: "function" });
  } finally {
    agent.cleanup();
    await kernel.close();
  }
});
