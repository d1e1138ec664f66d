// The client against a fake kernel socket: the hello handshake, every method's wire
// shape, errors, concurrency, framing, and a connection that goes away.
"use strict";

const assert = require("node:assert/strict");
const { test, describe, afterEach } = require("node:test");

const keel = require("../dist/index.js");
const { FakeKernel, TOKEN, helloKernel } = require("./fake_kernel.js");

const cleanups = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function start(serve, options) {
  const kernel = await helloKernel(serve, options);
  cleanups.push(() => kernel.close());
  return kernel;
}

async function connect(kernel) {
  const client = await keel.connect({ socketPath: kernel.path, token: TOKEN });
  cleanups.push(() => client.close());
  return client;
}

/** Runs `body` with the environment changed as given (undefined removes a variable). */
async function withEnv(changes, body) {
  const saved = {};
  for (const [name, value] of Object.entries(changes)) {
    saved[name] = process.env[name];
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
  try {
    return await body();
  } finally {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  }
}

/** Serves every request with `answers[method]` (or an error when it has none), recording it. */
function answering(answers, requests) {
  return async (conn) => {
    for (let request; (request = await conn.read()) !== null; ) {
      requests.push(request);
      if (request.method in answers) conn.answer(request, answers[request.method]);
      else conn.fail(request, -32601, `no method ${request.method}`);
    }
  };
}

describe("connect", () => {
  test("hello sends the token from the environment as request 0", async () => {
    const kernel = await start();
    const client = await withEnv(kernel.env(), () => keel.connect());
    cleanups.push(() => client.close());
    assert.equal(client.runId, "run_1");
    assert.equal(client.protocol, 1);
    assert.deepEqual(kernel.requests, [{ jsonrpc: "2.0", id: 0, method: "hello", params: { token: TOKEN } }]);
  });

  test("a missing KEEL_SOCKET says to run under keel run", async () => {
    await withEnv({ KEEL_SOCKET: undefined, KEEL_RUN_TOKEN: undefined }, async () => {
      await assert.rejects(keel.connect(), (err) => {
        assert.ok(err instanceof keel.NotUnderKeel);
        assert.match(err.message, /not running under Keel/);
        assert.match(err.message, /keel run -- node your_agent\.js/);
        assert.match(err.message, /KEEL_SOCKET is not set/);
        return true;
      });
    });
  });

  test("a missing KEEL_RUN_TOKEN is named", async () => {
    await withEnv({ KEEL_SOCKET: "/nonexistent.sock", KEEL_RUN_TOKEN: undefined }, async () => {
      await assert.rejects(keel.connect(), (err) => err instanceof keel.NotUnderKeel && /KEEL_RUN_TOKEN/.test(err.message));
    });
  });

  test("an unreachable socket is ConnectionLost naming the path", async () => {
    await assert.rejects(keel.connect({ socketPath: "/nonexistent/keel.sock", token: TOKEN }), (err) => {
      assert.ok(err instanceof keel.ConnectionLost);
      assert.match(err.message, /\/nonexistent\/keel\.sock/);
      return true;
    });
  });

  test("a refused token is KeelError unauthenticated from hello", async () => {
    const kernel = await FakeKernel.start(async (conn) => {
      conn.fail(await conn.read(), 1000, "unknown run token", { kind: "unauthenticated" });
    });
    cleanups.push(() => kernel.close());
    await assert.rejects(keel.connect({ socketPath: kernel.path, token: "forged" }), (err) => {
      assert.ok(err instanceof keel.KeelError);
      assert.deepEqual([err.code, err.kind, err.method], [1000, "unauthenticated", "hello"]);
      return true;
    });
  });

  test("another protocol version is refused", async () => {
    const kernel = await FakeKernel.start(async (conn) => {
      conn.answer(await conn.read(), { run_id: "r", protocol: 2 });
      await conn.readLine();
    });
    cleanups.push(() => kernel.close());
    await assert.rejects(keel.connect({ socketPath: kernel.path, token: TOKEN }), (err) => {
      assert.ok(err instanceof keel.ProtocolError);
      assert.match(err.message, /protocol 2/);
      return true;
    });
  });
});

describe("calls", () => {
  test("concurrent calls are matched by id when answered out of order", async () => {
    const count = 8;
    const received = [];
    const kernel = await start(async (conn) => {
      for (let i = 0; i < count; i++) received.push(await conn.read()); // none answered yet
      for (const request of [...received].reverse()) conn.answer(request, { result: request.params.args });
      await conn.readLine();
    });
    const client = await connect(kernel);
    const results = await Promise.all(Array.from({ length: count }, (_, n) => client.tool("echo", { n })));
    assert.deepEqual(results, Array.from({ length: count }, (_, n) => ({ n })));
    const ids = received.map((r) => r.id);
    assert.equal(new Set(ids).size, count, "request ids are unique");
    assert.ok(!ids.includes(0), "id 0 belongs to hello");
  });

  test("each syscall sends the contract's params and unwraps its result", async () => {
    const requests = [];
    const answers = {
      "llm.chat": {
        message: { role: "assistant", content: "hi" },
        usage: { input_tokens: 3, output_tokens: 1 },
        cost_usd: 0,
        model: "scripted",
      },
      "llm.embed": { model: "hash", embeddings: [[0.5, 0.25]], input_tokens: 0 },
      "tool.call": { result: true },
      "tool.list": { tools: [{ name: "echo", description: "", input_schema: {} }] },
      "code.exec": { result: 3, stdout: "", tool_calls: [], duration_us: 10 },
      "proc.spawn": { run_id: "run_child" },
      "proc.wait": { run_id: "run_child", state: "succeeded", output: 1, error: null, exit_code: 0 },
      "proc.signal": {},
      "ipc.register": {},
      "sys.sleep": {},
      "state.checkpoint": { seq: 7 },
      "state.restore": { state: { step: 2 } },
      "sys.now": { unix_ms: 1700000000000 },
      "sys.ping": {},
      "sys.random": { value: 12345 },
      "human.ask": { answer: "yes" },
      "run.emit": {},
      "run.exit": {},
      "mem.thread.append": { index: 4 },
      "mem.thread.read": { messages: [{ index: 4, role: "user", content: "hi" }] },
      "mem.put": {},
      "mem.get": { value: { v: 1 } },
      "mem.delete": { deleted: true },
      "mem.search": { hits: [{ key: "k", score: 1.5, snippet: "[hi]" }] },
      // With `recv`, a send answers the message received too.
      "ipc.send": { seq: 3, message: { from: "run_b", seq: 4, message: "r" } },
      "ipc.recv": {
        message: { from: "run_a", seq: 1, message: { q: 1 }, correlation_id: "c1" },
        messages: [{ from: "run_a", seq: 1, message: { q: 1 } }, { from: null, seq: 2, message: "x" }],
      },
      "ipc.subscribe": {},
      "ipc.unsubscribe": {},
      "ipc.publish": { delivered: 2 },
    };
    const client = await connect(await start(answering(answers, requests)));

    const chat = await client.llmChat([{ role: "user", content: "hello" }], { maxTokens: 5 });
    assert.equal(chat.message.content, "hi");
    await client.llmChat([{ role: "user", content: "x" }], {
      model: "m",
      tools: [{ type: "function", function: { name: "f" } }],
      temperature: 0.5,
      toolChoice: "auto",
      stop: ["\n"],
      topP: 0.9,
      responseFormat: { type: "json_object" },
      parallelToolCalls: false,
    });
    assert.deepEqual((await client.embed(["a"])).embeddings, [[0.5, 0.25]]);
    await client.embed(["a", "b"], { model: "text-embedding-3-small" });
    assert.equal(await client.tool("kv.put", { key: "k", value: [1, 2] }), true);
    await client.tool("sys.noargs");
    assert.equal((await client.listTools())[0].name, "echo");
    assert.equal((await client.exec("1 + 2")).result, 3);
    await client.exec("x * 2", { lang: "javascript", inputs: { x: 1 }, limits: { timeout_ms: 100 } });
    await client.exec("0", { limits: {} });
    assert.equal(await client.spawn(["node", "child.js"]), "run_child");
    await client.spawn(["node", "child.js"], { input: { n: 1 }, env: { A: "1" }, grant: ["kv.*"], priority: "low" });
    await client.spawn({ agent: "researcher", env: {}, budget: { max_usd: 1 } });
    assert.equal((await client.wait("run_child")).state, "succeeded");
    await client.wait("run_child", { timeoutMs: 10 });
    assert.deepEqual(await client.signal("run_child", "pause"), {});
    assert.equal(await client.register("planner"), undefined);
    assert.equal(await client.sleep(25), undefined);
    assert.equal(await client.checkpoint({ step: 2 }), 7);
    assert.deepEqual(await client.restore(), { step: 2 });
    assert.equal(await client.nowMs(), 1700000000000);
    assert.equal(await client.ping(), undefined);
    assert.equal(await client.random(), 12345n);
    assert.equal(await client.ask("approve?"), "yes");
    assert.equal(await client.emit({ progress: 1 }), undefined);
    assert.equal(await client.threadAppend("t1", "user", "hi"), 4);
    assert.equal((await client.threadRead("t1", { last: 2 }))[0].content, "hi");
    await client.threadRead("t1", { maxTokens: 100 });
    assert.equal(await client.memPut("notes", "k", { v: 1 }, { text: "hello" }), undefined);
    await client.memPut("notes", "k", 2);
    assert.deepEqual(await client.memGet("notes", "k"), { v: 1 });
    assert.equal(await client.memDelete("notes", "k"), true);
    assert.equal((await client.memSearch("notes", "hi", { limit: 3, mode: "hybrid" }))[0].key, "k");
    assert.deepEqual(await client.memSearch("notes", "hi"), [{ key: "k", score: 1.5, snippet: "[hi]" }]);
    assert.equal(await client.send("run_b", { q: 1 }), 3);
    await client.send("run_b", "x", { correlationId: "c1", wait: false });
    await client.send("run_b", "y", { wait: true });
    assert.equal((await client.sendRecv("run_b", { q: 2 })).message, "r");
    assert.equal((await client.sendRecv("run_b", 1, { correlationId: "c2", timeoutMs: 9 })).seq, 4);
    assert.equal((await client.recv()).correlation_id, "c1");
    assert.deepEqual((await client.recv({ timeoutMs: 50 })).message, { q: 1 });
    assert.deepEqual((await client.recvMany(10)).map((m) => m.seq), [1, 2]);
    assert.equal((await client.recvMany(2, { timeoutMs: 5 })).length, 2);
    assert.equal(await client.subscribe("news"), undefined);
    assert.equal(await client.publish("news", { h: 1 }), 2);
    await client.publish("news", "x", { wait: false });
    assert.equal(await client.unsubscribe("news"), undefined);
    assert.equal(await client.exit({ ok: true }), undefined);
    await client.exit();

    const sent = requests.map((r) => [r.method, r.params]);
    assert.deepEqual(sent, [
      // Options left unset are absent, not null: replay matches exact params.
      ["llm.chat", { messages: [{ role: "user", content: "hello" }], max_tokens: 5 }],
      [
        "llm.chat",
        {
          messages: [{ role: "user", content: "x" }],
          model: "m",
          tools: [{ type: "function", function: { name: "f" } }],
          temperature: 0.5,
          tool_choice: "auto",
          stop: ["\n"],
          top_p: 0.9,
          response_format: { type: "json_object" },
          parallel_tool_calls: false,
        },
      ],
      ["llm.embed", { input: ["a"] }],
      ["llm.embed", { input: ["a", "b"], model: "text-embedding-3-small" }],
      ["tool.call", { name: "kv.put", args: { key: "k", value: [1, 2] } }],
      ["tool.call", { name: "sys.noargs", args: {} }],
      ["tool.list", {}],
      ["code.exec", { lang: "python", code: "1 + 2", inputs: {} }],
      ["code.exec", { lang: "javascript", code: "x * 2", inputs: { x: 1 }, limits: { timeout_ms: 100 } }],
      ["code.exec", { lang: "python", code: "0", inputs: {} }],
      ["proc.spawn", { command: ["node", "child.js"] }],
      ["proc.spawn", { command: ["node", "child.js"], input: { n: 1 }, env: { A: "1" }, grant: ["kv.*"], priority: "low" }],
      ["proc.spawn", { agent: "researcher", budget: { max_usd: 1 } }],
      ["proc.wait", { run_id: "run_child" }],
      ["proc.wait", { run_id: "run_child", timeout_ms: 10 }],
      ["proc.signal", { run_id: "run_child", signal: "pause" }],
      ["ipc.register", { name: "planner" }],
      ["sys.sleep", { ms: 25 }],
      ["state.checkpoint", { state: { step: 2 } }],
      ["state.restore", {}],
      ["sys.now", {}],
      ["sys.ping", {}],
      ["sys.random", {}],
      ["human.ask", { question: "approve?" }],
      ["run.emit", { event: { progress: 1 } }],
      ["mem.thread.append", { thread: "t1", message: { role: "user", content: "hi" } }],
      ["mem.thread.read", { thread: "t1", last: 2 }],
      ["mem.thread.read", { thread: "t1", max_tokens: 100 }],
      ["mem.put", { namespace: "notes", key: "k", value: { v: 1 }, text: "hello" }],
      ["mem.put", { namespace: "notes", key: "k", value: 2 }],
      ["mem.get", { namespace: "notes", key: "k" }],
      ["mem.delete", { namespace: "notes", key: "k" }],
      ["mem.search", { namespace: "notes", query: "hi", limit: 3, mode: "hybrid" }],
      ["mem.search", { namespace: "notes", query: "hi" }],
      ["ipc.send", { to: "run_b", message: { q: 1 } }],
      ["ipc.send", { to: "run_b", message: "x", correlation_id: "c1", wait: false }],
      ["ipc.send", { to: "run_b", message: "y" }],
      ["ipc.send", { to: "run_b", message: { q: 2 }, recv: {} }],
      ["ipc.send", { to: "run_b", message: 1, correlation_id: "c2", recv: { timeout_ms: 9 } }],
      ["ipc.recv", {}],
      ["ipc.recv", { timeout_ms: 50 }],
      ["ipc.recv", { max: 10 }],
      ["ipc.recv", { max: 2, timeout_ms: 5 }],
      ["ipc.subscribe", { topic: "news" }],
      ["ipc.publish", { topic: "news", message: { h: 1 } }],
      ["ipc.publish", { topic: "news", message: "x", wait: false }],
      ["ipc.unsubscribe", { topic: "news" }],
      ["run.exit", { output: { ok: true } }],
      ["run.exit", { output: null }],
    ]);
    assert.ok(requests.every((r) => r.jsonrpc === "2.0" && Number.isInteger(r.id)));
  });

  test("UI blocks and form questions send the contract's params", async () => {
    const requests = [];
    let seq = 0;
    const form = { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"] };
    const kernel = await start(async (conn) => {
      for (let request; (request = await conn.read()) !== null; ) {
        requests.push(request);
        if (request.method === "ui.show") conn.answer(request, { seq: ++seq });
        else if ("form" in request.params) conn.answer(request, { answer: '{"ok":true}', value: { ok: true } });
        else conn.answer(request, { answer: "plain" });
      }
    });
    const client = await connect(kernel);
    assert.equal(await client.showTable(["a", "b"], [[1, "x"]], "T"), 1);
    assert.equal(await client.showTable(["a"], []), 2);
    assert.equal(await client.showChart("bar", ["q1"], { rev: [3] }, "C"), 3);
    assert.equal(await client.showChart("line", ["q1"], [{ name: "s", values: [1.5] }]), 4);
    assert.equal(await client.showMarkdown("# hi"), 5);
    assert.equal(await client.showProgress(0.25, "quarter"), 6);
    assert.equal(await client.showProgress(1), 7);
    assert.equal(await client.showForm("f1", form, "F"), 8);
    assert.equal(await client.show({ type: "markdown", text: "raw" }), 9);
    assert.deepEqual(await client.ask("ok?", { form }), { ok: true }, "a form gives the value");
    assert.equal(await client.ask("ok?"), "plain", "no form gives the text, as before");
    const block = (b) => ["ui.show", { block: b }];
    assert.deepEqual(
      requests.map((r) => [r.method, r.params]),
      [
        block({ type: "table", columns: ["a", "b"], rows: [[1, "x"]], title: "T" }),
        block({ type: "table", columns: ["a"], rows: [] }),
        block({ type: "chart", kind: "bar", labels: ["q1"], series: [{ name: "rev", values: [3] }], title: "C" }),
        block({ type: "chart", kind: "line", labels: ["q1"], series: [{ name: "s", values: [1.5] }] }),
        block({ type: "markdown", text: "# hi" }),
        block({ type: "progress", value: 0.25, label: "quarter" }),
        block({ type: "progress", value: 1 }),
        block({ type: "form", id: "f1", schema: form, title: "F" }),
        block({ type: "markdown", text: "raw" }),
        ["human.ask", { question: "ok?", form }],
        ["human.ask", { question: "ok?" }],
      ],
    );
  });

  test("a result without its field is a ProtocolError naming the method", async () => {
    const client = await connect(await start(answering({ "sys.now": { wrong: 1 }, "llm.chat": [1] }, [])));
    await assert.rejects(client.nowMs(), (err) => err instanceof keel.ProtocolError && /sys\.now.*"unix_ms"/.test(err.message));
    await assert.rejects(client.llmChat([]), (err) => err instanceof keel.ProtocolError && /llm\.chat: expected an object/.test(err.message));
  });

  test("bad arguments are refused before anything is sent", async () => {
    const requests = [];
    const client = await connect(await start(answering({ "sys.ping": {} }, requests)));
    await assert.rejects(client.sleep(1.5), (err) => err instanceof TypeError && /sleep: ms must be a whole number/.test(err.message));
    await assert.rejects(client.call("sys.ping", [1]), (err) => err instanceof TypeError && /params must be an object/.test(err.message));
    await assert.rejects(client.checkpoint({ score: NaN }), (err) => {
      assert.ok(err instanceof TypeError);
      assert.match(err.message, /state\.checkpoint: .*params\.state\.score is NaN/);
      return true;
    });
    const cycle = { name: "loop" };
    cycle.self = cycle;
    await assert.rejects(client.emit(cycle), (err) => err instanceof TypeError && /params\.event\.self .*cycle/.test(err.message));
    await client.ping(); // the connection is still fine
    assert.deepEqual(requests.map((r) => r.method), ["sys.ping"]);
  });
});

describe("JSON values", () => {
  test("u64s and other big integers arrive as bigint and go back exactly", async () => {
    const requests = [];
    const kernel = await start(async (conn) => {
      for (let request; (request = await conn.readLine()) !== null; ) {
        requests.push(request); // the raw line: JSON.parse would round the integers
        const { id, method } = JSON.parse(request);
        const result =
          method === "sys.random"
            ? '{"value":18446744073709551615}'
            : method === "state.restore"
              ? '{"state":{"random":9007199254740993,"small":3,"float":12345678901234567.5,"text":"12345678901234567890"}}'
              : '{"seq":2}';
        conn.write(`{"jsonrpc":"2.0","id":${id},"result":${result}}\n`);
      }
    });
    const client = await connect(kernel);
    const random = await client.random();
    assert.equal(random, 18446744073709551615n);
    assert.equal(await client.checkpoint({ random, list: [random, 1n] }), 2);
    assert.match(requests[1], /"params":\{"state":\{"random":18446744073709551615,"list":\[18446744073709551615,1\]\}\}/);
    assert.deepEqual(await client.restore(), {
      random: 9007199254740993n,
      small: 3,
      float: 12345678901234567.5,
      text: "12345678901234567890",
    });
  });

  test("parseJson and stringifyJson agree with JSON where JSON is exact", () => {
    const samples = [
      '{"a":[1,-2,3.5,1e21,-0.5e-3,true,false,null],"s":"\\u00e9\\n\\"q\\"","__proto__":{"x":1},"o":{}}',
      '[[],{},"",0,-0,9007199254740991,-9007199254740991,"99999999999999999999"]',
      ' { "k" : [ 1 , 2 ] } ',
    ];
    for (const text of samples) {
      assert.deepEqual(keel.parseJson(text), JSON.parse(text), text);
      assert.equal(keel.stringifyJson(JSON.parse(text)), JSON.stringify(JSON.parse(text)));
    }
    // A key "__proto__" stays data, as JSON.parse makes it, also on the bigint path.
    const parsed = keel.parseJson('{"__proto__":{"polluted":12345678901234567890}}');
    assert.equal(Object.getPrototypeOf(parsed), Object.prototype);
    assert.equal(parsed["__proto__"].polluted, 12345678901234567890n);
    assert.equal(keel.stringifyJson({ a: undefined, b: [undefined], d: new Date(0), n: 10n ** 30n }), '{"b":[null],"d":"1970-01-01T00:00:00.000Z","n":1000000000000000000000000000000}');
    assert.throws(() => keel.parseJson("{1"), SyntaxError);
  });
});

describe("errors", () => {
  test("error answers reject with KeelError carrying code, kind, data and method", async () => {
    const kernel = await start(async (conn) => {
      conn.fail(await conn.read(), 1007, "the run's budget of $1.00 is spent; top it up with `keel budget`", {
        kind: "budget_exhausted",
        limit_usd: 1.0,
      });
      conn.fail(await conn.read(), -32601, "no method 'nope'"); // no data at all
      conn.fail(await conn.read(), 1010, "the mailbox of run run_b is full"); // kind from the code
      conn.fail(await conn.read(), 4242, "something new"); // a code this SDK does not know
      await conn.readLine();
    });
    const client = await connect(kernel);
    await assert.rejects(client.llmChat([{ role: "user", content: "hi" }]), (err) => {
      assert.ok(err instanceof keel.KeelError && err instanceof Error);
      assert.deepEqual([err.code, err.kind, err.method], [1007, "budget_exhausted", "llm.chat"]);
      assert.deepEqual(err.data, { kind: "budget_exhausted", limit_usd: 1 });
      assert.equal(err.message, "the run's budget of $1.00 is spent; top it up with `keel budget`");
      assert.equal(
        String(err),
        "KeelError: llm.chat failed: the run's budget of $1.00 is spent; top it up with `keel budget` [budget_exhausted, code 1007]",
      );
      assert.match(err.stack, /^KeelError: llm\.chat failed: .*\[budget_exhausted, code 1007\]\n\s+at /);
      return true;
    });
    await assert.rejects(client.call("nope"), (err) => {
      assert.deepEqual([err.code, err.kind, err.data], [-32601, "unknown_method", null]);
      return true;
    });
    await assert.rejects(client.send("run_b", { n: 1 }, { wait: false }), (err) => {
      assert.deepEqual([err.kind, err.method], ["would_block", "ipc.send"]);
      return true;
    });
    await assert.rejects(client.ping(), (err) => err.kind === "unknown" && err.code === 4242);
  });

  test("an oversized request is refused locally and the connection survives", async () => {
    const requests = [];
    const client = await connect(await start(answering({ "sys.now": { unix_ms: 5 } }, requests)));
    await assert.rejects(client.emit("x".repeat(keel.MAX_LINE_BYTES)), (err) => {
      assert.deepEqual([err.code, err.kind, err.method], [-32600, "too_large", "run.emit"]);
      assert.match(err.message, /refuses run.emit lines over 1048576 bytes/);
      return true;
    });
    assert.equal(await client.nowMs(), 5);
    assert.deepEqual(requests.map((r) => r.method), ["sys.now"]);
  });

  test("a timeout gives up waiting without breaking the connection", async () => {
    const kernel = await start(async (conn) => {
      const slow = await conn.read(); // not answered until the next call is
      conn.answer(await conn.read(), { unix_ms: 9 });
      conn.answer(slow, { answer: "too late" }); // dropped: nobody waits for it
      conn.answer(await conn.read(), { unix_ms: 10 });
      await conn.readLine();
    });
    const client = await connect(kernel);
    await assert.rejects(client.ask("anyone?", { timeoutMs: 50 }), (err) => {
      assert.ok(err instanceof keel.TimeoutError);
      assert.match(err.message, /human\.ask: no answer from the Keel kernel within 50 ms/);
      return true;
    });
    assert.equal(await client.nowMs(), 9);
    assert.equal(await client.nowMs(), 10);
  });

  test("an AbortSignal stops waiting for a call", async () => {
    const kernel = await start(async (conn) => {
      await conn.read(); // never answered
      conn.answer(await conn.read(), {});
      await conn.readLine();
    });
    const client = await connect(kernel);
    const controller = new AbortController();
    const asked = client.ask("anyone?", { signal: controller.signal });
    controller.abort(new Error("the user gave up"));
    await assert.rejects(asked, /the user gave up/);
    await client.ping();
    await assert.rejects(client.ask("again?", { signal: controller.signal }), /the user gave up/);
  });
});

describe("framing", () => {
  test("answers split anywhere, even inside a character, and several in one write", async () => {
    const kernel = await start(async (conn) => {
      const first = await conn.read();
      const second = await conn.read();
      const third = await conn.read();
      const bytes = Buffer.from(JSON.stringify({ jsonrpc: "2.0", id: first.id, result: { answer: "héllo ✓" } }) + "\n");
      for (let i = 0; i < bytes.length; i++) {
        conn.socket.write(bytes.subarray(i, i + 1)); // one byte a write
        await new Promise((resolve) => setImmediate(resolve));
      }
      conn.write(
        JSON.stringify({ jsonrpc: "2.0", id: third.id, result: { unix_ms: 3 } }) +
          "\n" +
          JSON.stringify({ jsonrpc: "2.0", id: second.id, result: { unix_ms: 2 } }) +
          "\n",
      );
      await conn.readLine();
    });
    const client = await connect(kernel);
    const results = await Promise.all([client.ask("q"), client.nowMs(), client.nowMs()]);
    assert.deepEqual(results, ["héllo ✓", 2, 3]);
  });

  test("a line that is not JSON ends the connection, saying so", async () => {
    const kernel = await start(async (conn) => {
      await conn.read();
      conn.write("this is not json\n");
      await conn.readLine();
    });
    const client = await connect(kernel);
    await assert.rejects(client.nowMs(), (err) => err instanceof keel.ConnectionLost && /not JSON: "this is not json"/.test(err.message));
    await assert.rejects(client.nowMs(), keel.ConnectionLost);
  });
});

describe("a connection that goes away", () => {
  test("calls in flight and later calls reject with ConnectionLost", async () => {
    const kernel = await start(async (conn) => {
      await conn.read(); // then hang up without answering
    });
    const client = await connect(kernel);
    await assert.rejects(client.llmChat([{ role: "user", content: "hi" }]), (err) => {
      assert.ok(err instanceof keel.ConnectionLost);
      assert.match(err.message, /closed the connection/);
      return true;
    });
    await assert.rejects(client.nowMs(), keel.ConnectionLost);
  });

  test("an error without id before the close explains it", async () => {
    const kernel = await start(async (conn) => {
      await conn.read();
      conn.send({ jsonrpc: "2.0", id: null, error: { code: -32600, message: "line over 1 MiB", data: { kind: "too_large" } } });
    });
    const client = await connect(kernel);
    await assert.rejects(client.nowMs(), (err) => err instanceof keel.ConnectionLost && /line over 1 MiB/.test(err.message));
  });

  test("close releases waiting callers and is idempotent", async () => {
    let received;
    const got = new Promise((resolve) => (received = resolve));
    const kernel = await start(async (conn) => {
      await conn.read();
      received();
      await conn.readLine(); // until the client goes away
    });
    const client = await connect(kernel);
    const asked = client.ask("approve?");
    await got;
    client.close();
    await assert.rejects(asked, (err) => err instanceof keel.ConnectionLost && /the client was closed/.test(err.message));
    client.close();
    await assert.rejects(client.ping(), keel.ConnectionLost);
  });
});

describe("input", () => {
  test("reads KEEL_INPUT as JSON, or gives the default", async () => {
    await withEnv({ KEEL_INPUT: '{"topic":"tides","id":12345678901234567890}' }, () => {
      assert.deepEqual(keel.input(), { topic: "tides", id: 12345678901234567890n });
    });
    await withEnv({ KEEL_INPUT: undefined }, () => {
      assert.equal(keel.input(), undefined);
      assert.deepEqual(keel.input({ topic: "default" }), { topic: "default" });
    });
    await withEnv({ KEEL_INPUT: "{oops" }, () => {
      assert.throws(() => keel.input(), (err) => err instanceof keel.ProtocolError && /KEEL_INPUT is not JSON/.test(err.message));
    });
  });
});
