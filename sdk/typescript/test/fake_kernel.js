// A stand-in for the Keel kernel's syscall socket, for testing the SDK hermetically.
//
// `FakeKernel` is a bare Unix socket server in a temporary directory: each connection is
// handed to a test's own handler, which reads and writes JSON lines as it likes (to
// answer out of order, split an answer across writes, drop the connection, send
// errors...). It plays the kernel's side of protocol 1 only as far as each test says.
"use strict";

const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");

const SDK_DIR = path.resolve(__dirname, "..");
const TOKEN = "secret-token";

/** One accepted connection, read and written as JSON lines. */
class LineConnection {
  constructor(socket) {
    this.socket = socket;
    this.buffer = Buffer.alloc(0);
    this.ended = false;
    this.waiters = [];
    socket.on("data", (chunk) => {
      this.buffer = Buffer.concat([this.buffer, chunk]);
      this.wake();
    });
    socket.on("close", () => {
      this.ended = true;
      this.wake();
    });
    socket.on("error", () => {});
  }

  wake() {
    for (const waiter of this.waiters.splice(0)) waiter();
  }

  /** The next line (a string without its newline), or null at end of stream. */
  async readLine() {
    for (;;) {
      const newline = this.buffer.indexOf(0x0a);
      if (newline >= 0) {
        const line = this.buffer.subarray(0, newline).toString("utf8");
        this.buffer = this.buffer.subarray(newline + 1);
        return line;
      }
      if (this.ended) return null;
      await new Promise((resolve) => this.waiters.push(resolve));
    }
  }

  /** The next line parsed as JSON, or null at end of stream. */
  async read() {
    const line = await this.readLine();
    return line === null ? null : JSON.parse(line);
  }

  /** Writes raw text (a test may send partial lines or garbage). */
  write(text) {
    if (!this.socket.destroyed) this.socket.write(text);
  }

  send(message) {
    this.write(JSON.stringify(message) + "\n");
  }

  answer(request, result) {
    this.send({ jsonrpc: "2.0", id: request.id, result });
  }

  fail(request, code, message, data) {
    const error = data === undefined ? { code, message } : { code, message, data };
    this.send({ jsonrpc: "2.0", id: request.id, error });
  }

  close() {
    this.socket.destroy();
  }
}

/** A Unix socket server; `handler(conn)` serves each connection (and may be async). */
class FakeKernel {
  constructor(handler) {
    this.handler = handler;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-fake-"));
    this.path = path.join(this.dir, "keel.sock");
    this.connections = [];
    this.failures = [];
    this.server = net.createServer((socket) => {
      const conn = new LineConnection(socket);
      this.connections.push(conn);
      Promise.resolve()
        .then(() => this.handler(conn))
        .catch((err) => this.failures.push(err))
        .finally(() => conn.close());
    });
  }

  static async start(handler) {
    const kernel = new FakeKernel(handler);
    await new Promise((resolve, reject) => {
      kernel.server.once("error", reject);
      kernel.server.listen(kernel.path, resolve);
    });
    return kernel;
  }

  env(token = TOKEN) {
    return { KEEL_SOCKET: this.path, KEEL_RUN_TOKEN: token, KEEL_RUN_ID: "run_test" };
  }

  async close() {
    for (const conn of this.connections) conn.close();
    await new Promise((resolve) => this.server.close(() => resolve()));
    fs.rmSync(this.dir, { recursive: true, force: true });
    if (this.failures.length > 0) throw this.failures[0];
  }
}

/**
 * A kernel that answers hello (recording it in `requests`) and then hands the
 * connection to `serve`, if given.
 */
async function helloKernel(serve, { runId = "run_1", requests = [] } = {}) {
  const kernel = await FakeKernel.start(async (conn) => {
    const hello = await conn.read();
    requests.push(hello);
    conn.answer(hello, { run_id: runId, protocol: 1 });
    if (serve) await serve(conn);
    else await conn.readLine(); // hold the connection until the client goes
  });
  kernel.requests = requests;
  return kernel;
}

module.exports = { FakeKernel, LineConnection, SDK_DIR, TOKEN, helloKernel };
