"use strict";
/**
 * Keel's Node SDK: talk to the Keel agent kernel from an agent program.
 *
 * Keel starts your program with `KEEL_SOCKET` and `KEEL_RUN_TOKEN` set; {@link connect}
 * uses them. Every interaction with the world (LLM calls, tools, time, randomness, asking
 * a human) is a *syscall* that the kernel meters and journals:
 *
 * ```js
 * const keel = require("keel");
 *
 * const k = await keel.connect();
 * const state = (await k.restore()) ?? { done: 0 };   // resume after a crash
 * for (let step = state.done; step < 3; step++) {
 *   const reply = await k.llmChat([{ role: "user", content: `step ${step + 1}` }]);
 *   await k.tool("kv.put", { key: `step-${step + 1}`, value: reply.message.content });
 *   state.done = step + 1;
 *   await k.checkpoint(state);                        // replay after a crash starts here
 * }
 * await k.exit({ steps: state.done });
 * ```
 *
 * Run it with `keel run -- node agent.js`.
 *
 * Durability, and the one rule it asks of you: if the kernel crashes, it starts your
 * program again from the top and answers its syscalls from the journal (the LLM is not
 * called, nor paid, twice) until the program asks for something new. So a program must
 * do the same thing given the same syscall results: take time and randomness from
 * {@link Client.nowMs} and {@link Client.random}, call {@link Client.restore} first, and
 * {@link Client.checkpoint} after each unit of work.
 *
 * The wire contract is protocol 1: JSON-RPC 2.0, one object per line, over a Unix
 * socket; calls may be in flight together and are matched to their answers by id.
 * Results keep the wire's field names (`cost_usd`, `input_tokens`); methods and options
 * are camelCase. Integers a JS number cannot hold exactly (`sys.random`'s u64, or any
 * in your own data) arrive as `bigint`, and a `bigint` you send is written as a JSON
 * integer, so values survive a checkpoint and a replay unchanged.
 *
 * @packageDocumentation
 */
var __createBinding = (this && this.__createBinding) || (Object.create ? (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    var desc = Object.getOwnPropertyDescriptor(m, k);
    if (!desc || ("get" in desc ? !m.__esModule : desc.writable || desc.configurable)) {
      desc = { enumerable: true, get: function() { return m[k]; } };
    }
    Object.defineProperty(o, k2, desc);
}) : (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    o[k2] = m[k];
}));
var __setModuleDefault = (this && this.__setModuleDefault) || (Object.create ? (function(o, v) {
    Object.defineProperty(o, "default", { enumerable: true, value: v });
}) : function(o, v) {
    o["default"] = v;
});
var __importStar = (this && this.__importStar) || (function () {
    var ownKeys = function(o) {
        ownKeys = Object.getOwnPropertyNames || function (o) {
            var ar = [];
            for (var k in o) if (Object.prototype.hasOwnProperty.call(o, k)) ar[ar.length] = k;
            return ar;
        };
        return ownKeys(o);
    };
    return function (mod) {
        if (mod && mod.__esModule) return mod;
        var result = {};
        if (mod != null) for (var k = ownKeys(mod), i = 0; i < k.length; i++) if (k[i] !== "default") __createBinding(result, mod, k[i]);
        __setModuleDefault(result, mod);
        return result;
    };
})();
Object.defineProperty(exports, "__esModule", { value: true });
exports.Client = exports.TimeoutError = exports.NotUnderKeel = exports.ProtocolError = exports.ConnectionLost = exports.KeelError = exports.ERROR_KINDS = exports.MAX_EXEC_LINE_BYTES = exports.MAX_LINE_BYTES = exports.PROTOCOL_VERSION = void 0;
exports.input = input;
exports.connect = connect;
exports.parseJson = parseJson;
exports.stringifyJson = stringifyJson;
const net = __importStar(require("node:net"));
/** The protocol this SDK speaks; `hello` refuses a kernel that speaks another. */
exports.PROTOCOL_VERSION = 1;
/**
 * The kernel refuses longer request lines (and then closes the connection), so the
 * client refuses to send them and keeps the connection usable instead.
 */
exports.MAX_LINE_BYTES = 1024 * 1024;
/** A `code.exec` may carry up to 64 MiB of inputs (the kernel reads one such line at a time). */
exports.MAX_EXEC_LINE_BYTES = 129 * 1024 * 1024;
/** `data.kind` for each error code, used when an error arrives without one. */
exports.ERROR_KINDS = Object.freeze({
    [-32700]: "parse_error",
    [-32600]: "invalid_request",
    [-32601]: "unknown_method",
    [-32602]: "invalid_params",
    1000: "unauthenticated",
    1001: "denied",
    1002: "not_found",
    1003: "run_exited",
    1004: "provider_error",
    1005: "no_provider",
    1006: "tool_error",
    1007: "budget_exhausted",
    1008: "internal",
    1009: "cancelled",
    1010: "would_block",
});
const NOT_UNDER_KEEL = "not running under Keel: start this program with `keel run -- node your_agent.js`";
// -- errors --------------------------------------------------------------------------------
/**
 * The kernel answered a syscall with an error.
 *
 * `code` is the JSON-RPC code, `kind` the stable string from `data.kind` (match on this,
 * e.g. `err.kind === "budget_exhausted"`), `message` the kernel's explanation, `data`
 * the whole `data` member, and `method` the syscall that failed.
 */
class KeelError extends Error {
    name = "KeelError";
    code;
    /** An {@link ErrorKind}, or `"unknown"` for a code this SDK does not know. */
    kind;
    data;
    method;
    constructor(code, message, data, method) {
        super(message);
        this.code = code;
        this.data = data ?? null;
        this.method = method;
        const kind = isObject(data) ? data["kind"] : undefined;
        this.kind = typeof kind === "string" ? kind : (exports.ERROR_KINDS[code] ?? "unknown");
        // An uncaught KeelError should say which call failed and how, not only the message.
        if (typeof this.stack === "string") {
            const rest = this.stack.indexOf("\n");
            this.stack = `${this.name}: ${this.describe()}${rest >= 0 ? this.stack.slice(rest) : ""}`;
        }
    }
    /** `"<method> failed: <message> [<kind>, code <code>]"`. */
    describe() {
        const where = this.method !== undefined ? `${this.method} failed: ` : "";
        return `${where}${this.message} [${this.kind}, code ${this.code}]`;
    }
    toString() {
        return `${this.name}: ${this.describe()}`;
    }
}
exports.KeelError = KeelError;
/**
 * The connection to the kernel is gone (or could not be made). Calls in flight and every
 * later call reject with this. Under Keel the right reaction is usually to exit: if the
 * kernel crashed, it restarts the agent and replays.
 */
class ConnectionLost extends Error {
    name = "ConnectionLost";
}
exports.ConnectionLost = ConnectionLost;
/** The kernel said something this SDK does not understand (a bug on one side). */
class ProtocolError extends Error {
    name = "ProtocolError";
}
exports.ProtocolError = ProtocolError;
/** `KEEL_SOCKET` or `KEEL_RUN_TOKEN` is missing: the program was not started by Keel. */
class NotUnderKeel extends Error {
    name = "NotUnderKeel";
    constructor(detail) {
        super(detail === undefined ? NOT_UNDER_KEEL : `${NOT_UNDER_KEEL} (${detail})`);
    }
}
exports.NotUnderKeel = NotUnderKeel;
/** No answer came within a call's `timeoutMs`; the connection stays usable. */
class TimeoutError extends Error {
    name = "TimeoutError";
}
exports.TimeoutError = TimeoutError;
// -- the client ----------------------------------------------------------------------
/** The run's input (`keel run --input JSON`; an agent called as a tool or spawned gets its
 * arguments there), or `defaultValue` when it has none. */
function input(defaultValue) {
    const text = process.env["KEEL_INPUT"];
    if (text === undefined) {
        return defaultValue;
    }
    try {
        return parseJson(text);
    }
    catch (err) {
        throw new ProtocolError(`KEEL_INPUT is not JSON (${errorText(err)}): ${text.slice(0, 200)}`);
    }
}
/**
 * Connect to the kernel and say hello.
 *
 * Reads `KEEL_SOCKET` and `KEEL_RUN_TOKEN` from the environment unless given. Rejects
 * with {@link NotUnderKeel} when they are missing, {@link ConnectionLost} when the socket
 * cannot be reached, and {@link KeelError} (kind `unauthenticated`) when the token is
 * refused.
 */
function connect(options = {}) {
    return Client.connect(options);
}
/**
 * A connection to the kernel. Build one with {@link connect}. Each method is one
 * syscall and returns a promise of its answer; any number of calls may be in flight at
 * once, and each gets its own answer.
 *
 * The connection keeps the process alive only while a call is in flight, so a program
 * ends when its work is done even if it never calls {@link Client.close}.
 */
class Client {
    /** The run's id, as the kernel's `hello` said. */
    runId = "";
    /** The protocol the kernel speaks (always {@link PROTOCOL_VERSION} once connected). */
    protocol = 0;
    #socket;
    #pending = new Map();
    #nextId = 1; // id 0 is hello's
    #partial = []; // bytes of a line not yet complete
    #closedReason = null;
    #orphanError = null; // an error the kernel sent with a null id
    constructor(socket) {
        this.#socket = socket;
        socket.on("data", (chunk) => this.#onData(chunk));
        socket.on("error", (err) => this.#failAll(`the connection to the Keel kernel failed: ${err.message}`));
        socket.on("close", () => this.#failAll("the Keel kernel closed the connection"));
        socket.unref();
    }
    /** See {@link connect}. */
    static async connect(options = {}) {
        const socketPath = options.socketPath ?? nonEmpty(process.env["KEEL_SOCKET"]);
        const token = options.token ?? nonEmpty(process.env["KEEL_RUN_TOKEN"]);
        if (socketPath === undefined) {
            throw new NotUnderKeel("KEEL_SOCKET is not set");
        }
        if (token === undefined) {
            throw new NotUnderKeel("KEEL_SOCKET is set but KEEL_RUN_TOKEN is not");
        }
        const socket = await new Promise((resolve, reject) => {
            const attempt = net.createConnection({ path: socketPath });
            const refused = (err) => {
                attempt.destroy();
                reject(new ConnectionLost(`cannot connect to the Keel kernel at ${socketPath}: ${err.message}`, { cause: err }));
            };
            attempt.once("error", refused);
            attempt.once("connect", () => {
                attempt.off("error", refused);
                resolve(attempt);
            });
        });
        const client = new Client(socket);
        try {
            const hello = object(await client.#request(0, "hello", { token }, {}), "hello");
            if (hello["protocol"] !== exports.PROTOCOL_VERSION) {
                throw new ProtocolError(`the kernel speaks protocol ${JSON.stringify(hello["protocol"])}; this SDK speaks ${exports.PROTOCOL_VERSION}`);
            }
            client.runId = String(field(hello, "run_id", "hello"));
            client.protocol = exports.PROTOCOL_VERSION;
        }
        catch (err) {
            client.close();
            throw err;
        }
        return client;
    }
    // -- the generic call ---------------------------------------------------------------
    /**
     * Send one request and return its `result` (an object for every protocol-1 method).
     * Rejects with {@link KeelError} for an error answer, {@link ConnectionLost} when the
     * connection goes, {@link TimeoutError} after `timeoutMs`.
     */
    call(method, params = {}, options = {}) {
        return this.#request(this.#nextId++, method, params, options);
    }
    #request(id, method, params, options) {
        if (this.#closedReason !== null) {
            return Promise.reject(new ConnectionLost(this.#closedReason));
        }
        if (!isObject(params)) {
            return Promise.reject(new TypeError(`${method}: params must be an object, got ${describeValue(params)}`));
        }
        let line;
        try {
            line = stringifyJson({ jsonrpc: "2.0", id, method, params }, "request") + "\n";
        }
        catch (err) {
            return Promise.reject(new TypeError(`${method}: cannot send the params as JSON: ${errorText(err)}`));
        }
        const bytes = Buffer.byteLength(line, "utf8");
        const limit = method === "code.exec" ? exports.MAX_EXEC_LINE_BYTES : exports.MAX_LINE_BYTES;
        if (bytes > limit) {
            return Promise.reject(new KeelError(-32600, `the request is ${bytes} bytes and the kernel refuses ${method} lines over ${limit} bytes; ` +
                "send less (store big data with a tool and pass a key)", { kind: "too_large" }, method));
        }
        const { timeoutMs, signal } = options;
        if (signal?.aborted) {
            return Promise.reject(signal.reason);
        }
        return new Promise((resolve, reject) => {
            const pending = { method, resolve, reject };
            this.#pending.set(id, pending);
            this.#socket.ref(); // a call in flight keeps the process alive
            if (timeoutMs !== undefined) {
                pending.timer = setTimeout(() => {
                    if (this.#settle(id)) {
                        reject(new TimeoutError(`${method}: no answer from the Keel kernel within ${timeoutMs} ms`));
                    }
                }, timeoutMs);
            }
            if (signal !== undefined) {
                const listener = () => {
                    if (this.#settle(id)) {
                        reject(signal.reason);
                    }
                };
                signal.addEventListener("abort", listener, { once: true });
                pending.abort = { signal, listener };
            }
            this.#socket.write(line, (err) => {
                if (err && this.#settle(id)) {
                    reject(new ConnectionLost(`sending ${method} to the Keel kernel failed: ${err.message}`, { cause: err }));
                }
            });
        });
    }
    /** Forgets request `id`; whether it was still waiting. A late answer is then dropped. */
    #settle(id) {
        const pending = this.#pending.get(id);
        if (pending === undefined) {
            return undefined;
        }
        this.#pending.delete(id);
        if (pending.timer !== undefined) {
            clearTimeout(pending.timer);
        }
        if (pending.abort !== undefined) {
            pending.abort.signal.removeEventListener("abort", pending.abort.listener);
        }
        if (this.#pending.size === 0) {
            this.#socket.unref(); // idle: let the program end when its work is done
        }
        return pending;
    }
    // -- the syscalls -------------------------------------------------------------------
    /** Ask the LLM (OpenAI chat shape). Returns the whole result: `message`, `usage`
     * (`input_tokens`, `output_tokens`), `cost_usd` and `model`. */
    async llmChat(messages, options = {}) {
        // Unset options are left out rather than sent as null: the kernel matches replayed
        // calls by their exact parameters.
        const params = compact({
            messages,
            model: options.model,
            tools: options.tools,
            max_tokens: options.maxTokens,
            temperature: options.temperature,
            tool_choice: options.toolChoice,
            stop: options.stop,
            top_p: options.topP,
            response_format: options.responseFormat,
            parallel_tool_calls: options.parallelToolCalls,
        });
        return object(await this.call("llm.chat", params), "llm.chat");
    }
    /** Vectors for `input` from the kernel's embedder (`llm.embed`), journaled like a read. */
    async embed(input, options = {}) {
        const params = compact({ input, model: options.model });
        return object(await this.call("llm.embed", params), "llm.embed");
    }
    /** Call a tool and return its result: `await k.tool("kv.put", { key: "k", value: 1 })`. */
    async tool(name, args = {}) {
        return field(await this.call("tool.call", { name, args }), "result", "tool.call");
    }
    /** The tools this run may call: `name`, `description`, `input_schema`. */
    async listTools() {
        return field(await this.call("tool.list"), "tools", "tool.list");
    }
    /**
     * Run a short program whose tool calls are governed, journaled syscalls (`code.exec`).
     *
     * Tools are functions inside it (`fs.read(path="a.txt")` in Python,
     * `fs.read({path: "a.txt"})` in JavaScript); `inputs` are its global variables. A
     * failing program rejects with a {@link KeelError} whose `data.exec_error` says how it
     * failed (`syntax`, `runtime`, `timeout`, `memory`, `tool_call_limit`...).
     */
    async exec(code, options = {}) {
        const params = { lang: options.lang ?? "python", code, inputs: options.inputs ?? {} };
        if (options.limits !== undefined && Object.keys(options.limits).length > 0) {
            params["limits"] = options.limits;
        }
        return object(await this.call("code.exec", params), "code.exec");
    }
    async spawn(command, options = {}) {
        const spec = isArray(command) ? { ...options, command } : command;
        const params = compact({
            command: spec.command,
            agent: spec.agent,
            input: spec.input,
            env: spec.env !== undefined && Object.keys(spec.env).length > 0 ? spec.env : undefined,
            grant: spec.grant,
            priority: spec.priority,
            budget: spec.budget,
        });
        return String(field(await this.call("proc.spawn", params), "run_id", "proc.spawn"));
    }
    /** Wait for a child run to end: `{run_id, state, output, error, exit_code}`, or
     * `{timed_out: true, ...}` after `timeoutMs`. Journaled: after a crash the wait
     * answers the same. */
    async wait(runId, options = {}) {
        const params = compact({ run_id: runId, timeout_ms: options.timeoutMs });
        return object(await this.call("proc.wait", params), "proc.wait");
    }
    /** `stop`, `pause` or `resume` a descendant run (or send it a custom signal). */
    async signal(runId, signal) {
        return object(await this.call("proc.signal", { run_id: runId, signal }), "proc.signal");
    }
    /** Take `name` in this run's tenant: other runs `send(name, ...)` to it while this run
     * lives (`ipc.register`). A name held by a live run rejects with kind `denied`. */
    async register(name) {
        await this.call("ipc.register", { name });
    }
    /** A durable timer: after a crash the run sleeps only what was left (`sys.sleep`). */
    async sleep(ms) {
        await this.call("sys.sleep", { ms: wholeNumber(ms, "sleep", "ms") });
    }
    /** Save `state` (any JSON); after a crash, {@link Client.restore} returns it and replay
     * starts here. Returns the checkpoint's sequence number. */
    async checkpoint(state) {
        return Number(field(await this.call("state.checkpoint", { state }), "seq", "state.checkpoint"));
    }
    /** The last checkpointed state, or null on a fresh run. */
    async restore() {
        return field(await this.call("state.restore"), "state", "state.restore");
    }
    /** Wall-clock time in Unix milliseconds, journaled (use instead of `Date.now()`). */
    async nowMs() {
        return Number(field(await this.call("sys.now"), "unix_ms", "sys.now"));
    }
    /** A no-op round trip to the kernel (not journaled): checks the channel is alive. */
    async ping() {
        await this.call("sys.ping");
    }
    /** A random unsigned 64-bit integer, journaled (use instead of `Math.random()`). A
     * `bigint`, since a JS number cannot hold every u64. */
    async random() {
        const value = field(await this.call("sys.random"), "value", "sys.random");
        if (typeof value === "bigint") {
            return value;
        }
        if (typeof value === "number" && Number.isSafeInteger(value)) {
            return BigInt(value);
        }
        throw new ProtocolError(`sys.random: the value is not an integer: ${describeValue(value)}`);
    }
    async ask(question, options = {}) {
        const { form, ...call } = options;
        if (form === undefined) {
            return String(field(await this.call("human.ask", { question }, call), "answer", "human.ask"));
        }
        return field(await this.call("human.ask", { question, form }, call), "value", "human.ask");
    }
    // -- UI blocks (shown on the run's console page, in order) ----------------------------
    /** Show `block` on the run's console page (`ui.show`). Journaled: after a crash a
     * replayed call is not shown twice. Resolves to the block's sequence number; a bad
     * block rejects with kind `invalid_params`, naming the field. */
    async show(block) {
        return Number(field(await this.call("ui.show", { block }), "seq", "ui.show"));
    }
    /** A table: each row has one cell per column. */
    async showTable(columns, rows, title) {
        return this.show(titled({ type: "table", columns, rows }, title));
    }
    /** A `line` or `bar` chart: each series has one value per label (a record of name to
     * values is taken too). */
    async showChart(kind, labels, series, title) {
        const list = Array.isArray(series)
            ? series
            : Object.entries(series).map(([name, values]) => ({ name, values }));
        return this.show(titled({ type: "chart", kind, labels, series: list }, title));
    }
    /** A markdown text. */
    async showMarkdown(text) {
        return this.show({ type: "markdown", text });
    }
    /** Progress from 0 to 1, with an optional label. */
    async showProgress(value, label) {
        return this.show(label === undefined ? { type: "progress", value } : { type: "progress", value, label });
    }
    /** A form (`schema`: a JSON schema of an object) the person fills in on the console. The
     * submitted value arrives in the run's mailbox as an operator message
     * `{ui_form: id, value: {...}}`: receive it with {@link Client.recv}. To wait for one
     * answer, `ask(question, {form})` is simpler. */
    async showForm(id, schema, title) {
        return this.show(titled({ type: "form", id, schema }, title));
    }
    /** Publish an event (any JSON) on the run's event stream. */
    async emit(event) {
        await this.call("run.emit", { event });
    }
    /** Finish the run with `output` (any JSON). Later calls reject with kind `run_exited`;
     * the program should end after this. */
    async exit(output = null) {
        await this.call("run.exit", { output });
    }
    // -- memory -------------------------------------------------------------------------
    /** Append a message to the conversation thread `thread` (shared by id between the runs
     * of a tenant; created on first append). Returns its index (0 first). */
    async threadAppend(thread, role, content) {
        const params = { thread, message: { role, content } };
        return Number(field(await this.call("mem.thread.append", params), "index", "mem.thread.append"));
    }
    /** The thread's messages, oldest first: the newest `last` of them and/or the newest that
     * fit in `maxTokens` (estimated). */
    async threadRead(thread, options = {}) {
        const params = compact({ thread, last: options.last, max_tokens: options.maxTokens });
        return field(await this.call("mem.thread.read", params), "messages", "mem.thread.read");
    }
    /** Store `value` (any JSON) under `namespace`/`key` in long-term memory. `text` is what
     * {@link Client.memSearch} finds it by (default: the value itself, or its JSON). */
    async memPut(namespace, key, value, options = {}) {
        await this.call("mem.put", compact({ namespace, key, value, text: options.text }));
    }
    /** The value stored under `namespace`/`key`, or null. */
    async memGet(namespace, key) {
        return field(await this.call("mem.get", { namespace, key }), "value", "mem.get");
    }
    /** Delete a record; whether there was one. */
    async memDelete(namespace, key) {
        return field(await this.call("mem.delete", { namespace, key }), "deleted", "mem.delete") === true;
    }
    /** Search a namespace: hits (`key`, `score`, `snippet`), most relevant first. `mode` is
     * `"text"` (full-text, the default), `"semantic"` or `"hybrid"`. */
    async memSearch(namespace, query, options = {}) {
        const params = compact({ namespace, query, limit: options.limit, mode: options.mode });
        return field(await this.call("mem.search", params), "hits", "mem.search");
    }
    // -- IPC ----------------------------------------------------------------------------
    /**
     * Put `message` (any JSON) in the mailbox of run `to` (a run of the same tenant, or a
     * registered name) and return its seq there. When the mailbox is full this waits for
     * room, or with `wait: false` rejects with kind `would_block` (nothing was sent).
     */
    async send(to, message, options = {}) {
        const params = compact({
            to,
            message,
            correlation_id: options.correlationId,
            wait: options.wait === false ? false : undefined,
        });
        return Number(field(await this.call("ipc.send", params), "seq", "ipc.send"));
    }
    /**
     * {@link Client.send}, then {@link Client.recv}, in one call: the next message of this
     * run's mailbox after the send (the reply, when the peer answers at once), or null when
     * `timeoutMs` passes first. Journaled and replayed as the two calls. The receive is on
     * offer before the peer hears of the send, so the peer's reply completes it in the
     * reply's own commit: a request/reply round trip of two commits.
     */
    async sendRecv(to, message, options = {}) {
        const params = compact({
            to,
            message,
            correlation_id: options.correlationId,
            recv: compact({ timeout_ms: options.timeoutMs }),
        });
        return field(await this.call("ipc.send", params), "message", "ipc.send");
    }
    /** The next message of this run's mailbox, waiting up to `timeoutMs` (forever when
     * absent); null on timeout. Each message is received once, and a restarted run
     * receives the same messages again. */
    async recv(options = {}) {
        const params = compact({ timeout_ms: options.timeoutMs });
        return field(await this.call("ipc.recv", params), "message", "ipc.recv");
    }
    /** Up to `max` (1 to 1000) of the oldest messages of this run's mailbox, oldest first:
     * at least one, waiting up to `timeoutMs` (forever when absent) for the first; empty on
     * timeout. Whatever is waiting is taken in one journaled step (one commit for the
     * batch, where `recv` makes one per message). Past the first message, a batch stops
     * before the messages' bodies exceed 1 MiB of JSON in all. */
    async recvMany(max, options = {}) {
        const params = compact({ max, timeout_ms: options.timeoutMs });
        return field(await this.call("ipc.recv", params), "messages", "ipc.recv");
    }
    /** Deliver messages published on the tenant's `topic` to this run's mailbox from now on. */
    async subscribe(topic) {
        await this.call("ipc.subscribe", { topic });
    }
    /** Stop delivering `topic`'s messages to this run. */
    async unsubscribe(topic) {
        await this.call("ipc.unsubscribe", { topic });
    }
    /** Put `message` in the mailbox of every run of the tenant subscribed to `topic` (all or
     * nothing); returns how many got it. */
    async publish(topic, message, options = {}) {
        const params = compact({ topic, message, wait: options.wait === false ? false : undefined });
        return Number(field(await this.call("ipc.publish", params), "delivered", "ipc.publish"));
    }
    // -- lifetime -----------------------------------------------------------------------
    /** Close the connection. Calls still waiting reject with {@link ConnectionLost}.
     * Idempotent. */
    close() {
        this.#failAll("the client was closed");
        this.#socket.destroy();
    }
    // -- reading ------------------------------------------------------------------------
    #onData(chunk) {
        let start = 0;
        for (;;) {
            const newline = chunk.indexOf(0x0a, start);
            if (newline < 0) {
                break;
            }
            const piece = chunk.subarray(start, newline);
            const line = this.#partial.length > 0 ? Buffer.concat([...this.#partial, piece]) : piece;
            this.#partial = [];
            start = newline + 1;
            const problem = this.#dispatch(line);
            if (problem !== undefined) {
                this.#failAll(problem);
                this.#socket.destroy();
                return;
            }
        }
        if (start < chunk.length) {
            this.#partial.push(chunk.subarray(start));
        }
    }
    /** Hands one answer to its caller. Returns a reason to give up, if any. */
    #dispatch(line) {
        const text = line.toString("utf8");
        let message;
        try {
            message = parseJson(text);
        }
        catch {
            return `the Keel kernel sent a line that is not JSON: ${JSON.stringify(text.slice(0, 200))}`;
        }
        if (!isObject(message)) {
            return `the Keel kernel sent JSON that is not an object: ${text.slice(0, 200)}`;
        }
        const id = message["id"];
        const error = message["error"];
        if (id === null || id === undefined) {
            if (isObject(error)) {
                // An error about a request the kernel could not attribute to an id. The kernel
                // closes the connection after such errors, so keep the explanation for the
                // callers that will see ConnectionLost.
                this.#orphanError = `the Keel kernel reported: ${String(error["message"])}`;
            }
            return undefined; // a notification: protocol 1 defines none, so ignore it
        }
        const pending = typeof id === "number" ? this.#settle(id) : undefined;
        if (pending === undefined) {
            return undefined; // a caller that timed out or gave up
        }
        if (isObject(error)) {
            const code = typeof error["code"] === "number" ? error["code"] : 0;
            pending.reject(new KeelError(code, String(error["message"] ?? ""), error["data"], pending.method));
        }
        else if ("result" in message) {
            pending.resolve(message["result"]);
        }
        else {
            pending.reject(new ProtocolError(`${pending.method}: an answer with neither result nor error: ${text.slice(0, 200)}`));
        }
        return undefined;
    }
    #failAll(reason) {
        if (this.#closedReason === null) {
            this.#closedReason = this.#orphanError !== null ? `${reason}; ${this.#orphanError}` : reason;
        }
        for (const id of [...this.#pending.keys()]) {
            this.#settle(id)?.reject(new ConnectionLost(this.#closedReason));
        }
    }
}
exports.Client = Client;
// -- JSON, without losing integers ----------------------------------------------------------
/** Any integer literal a JS number might not hold exactly has at least 16 digits. */
const LONG_DIGITS = /\d{16}/;
/** One JSON token (the text is known to be valid JSON when this is used). */
const TOKEN = /[ \t\n\r]*(?:("(?:[^"\\]|\\.)*")|(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(true|false|null)|([{}[\]:,]))/y;
/**
 * `JSON.parse`, except that an integer a JS number cannot hold exactly becomes a
 * `bigint` (a u64 from `sys.random`, a big id in a tool's result) instead of a nearby
 * double, so what the kernel journaled comes back unchanged.
 *
 * @internal
 */
function parseJson(text) {
    const value = JSON.parse(text); // validates; the common case ends here
    if (!LONG_DIGITS.test(text)) {
        return value;
    }
    const tokens = [];
    TOKEN.lastIndex = 0;
    while (TOKEN.lastIndex < text.length) {
        const start = TOKEN.lastIndex;
        const match = TOKEN.exec(text);
        if (match === null) {
            if (text.slice(start).trim() === "") {
                break;
            }
            throw new SyntaxError(`unexpected JSON at ${start}`);
        }
        tokens.push(match[1] ?? match[2] ?? match[3] ?? match[4] ?? "");
    }
    let at = 0;
    const next = () => tokens[at++] ?? "";
    const parseValue = () => {
        const token = next();
        if (token === "{") {
            const result = {};
            if (tokens[at] === "}") {
                at++;
                return result;
            }
            for (;;) {
                const key = JSON.parse(next());
                next(); // ":"
                // defineProperty, so that a key "__proto__" is data, as JSON.parse makes it.
                Object.defineProperty(result, key, { value: parseValue(), enumerable: true, writable: true, configurable: true });
                if (next() === "}") {
                    return result;
                }
            }
        }
        if (token === "[") {
            const result = [];
            if (tokens[at] === "]") {
                at++;
                return result;
            }
            for (;;) {
                result.push(parseValue());
                if (next() === "]") {
                    return result;
                }
            }
        }
        if (token.startsWith('"')) {
            return JSON.parse(token);
        }
        if (token === "true" || token === "false" || token === "null") {
            return JSON.parse(token);
        }
        const number = Number(token);
        if (/^-?\d+$/.test(token) && !Number.isSafeInteger(number)) {
            return BigInt(token);
        }
        return number;
    };
    return parseValue();
}
/**
 * `JSON.stringify`, except that a `bigint` is written as a JSON integer, and that NaN,
 * Infinity and cycles are refused naming where they are (JSON cannot carry them, and a
 * silent `null` would journal something other than what the program meant).
 *
 * @internal
 */
function stringifyJson(value, path = "value") {
    const ancestors = [];
    const write = (input, key, where) => {
        let item = input;
        if (item !== null && typeof item === "object" && typeof item.toJSON === "function") {
            item = item.toJSON(key);
        }
        if (item instanceof Number || item instanceof String || item instanceof Boolean || item instanceof BigInt) {
            item = item.valueOf();
        }
        switch (typeof item) {
            case "string":
                return JSON.stringify(item);
            case "number":
                if (!Number.isFinite(item)) {
                    throw new TypeError(`${where} is ${item}, which JSON cannot carry`);
                }
                return JSON.stringify(item);
            case "boolean":
                return item ? "true" : "false";
            case "bigint":
                return item.toString();
            case "undefined":
            case "function":
            case "symbol":
                return undefined;
            default:
                break;
        }
        if (item === null) {
            return "null";
        }
        const container = item;
        if (ancestors.includes(container)) {
            throw new TypeError(`${where} refers to one of its own parents, and JSON cannot carry a cycle`);
        }
        ancestors.push(container);
        let text;
        if (Array.isArray(container)) {
            const items = container.map((element, index) => write(element, String(index), `${where}[${index}]`) ?? "null");
            text = `[${items.join(",")}]`;
        }
        else {
            const members = [];
            for (const name of Object.keys(container)) {
                const member = write(container[name], name, `${where}.${name}`);
                if (member !== undefined) {
                    members.push(`${JSON.stringify(name)}:${member}`);
                }
            }
            text = `{${members.join(",")}}`;
        }
        ancestors.pop();
        return text;
    };
    return write(value, "", path) ?? "null";
}
// -- helpers -------------------------------------------------------------------------
function isObject(value) {
    return typeof value === "object" && value !== null && !Array.isArray(value);
}
function isArray(value) {
    return Array.isArray(value);
}
function nonEmpty(value) {
    return value === undefined || value === "" ? undefined : value;
}
/** The params without the members left undefined (absent, not null, on the wire). */
function compact(params) {
    const result = {};
    for (const [name, value] of Object.entries(params)) {
        if (value !== undefined) {
            result[name] = value;
        }
    }
    return result;
}
function object(value, method) {
    if (!isObject(value)) {
        throw new ProtocolError(`${method}: expected an object as the result, got ${describeValue(value)}`);
    }
    return value;
}
function titled(block, title) {
    return title === undefined ? block : { ...block, title };
}
function field(result, name, method) {
    if (!isObject(result) || !(name in result)) {
        throw new ProtocolError(`${method}: the result lacks ${JSON.stringify(name)}: ${describeValue(result)}`);
    }
    return result[name];
}
function wholeNumber(value, method, name) {
    if (!Number.isSafeInteger(value) || value < 0) {
        throw new TypeError(`${method}: ${name} must be a whole number of at least 0, got ${describeValue(value)}`);
    }
    return value;
}
function describeValue(value) {
    try {
        return stringifyJson(value).slice(0, 200);
    }
    catch {
        return String(value);
    }
}
function errorText(err) {
    return err instanceof Error ? err.message : String(err);
}
