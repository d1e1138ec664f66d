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
/** The protocol this SDK speaks; `hello` refuses a kernel that speaks another. */
export declare const PROTOCOL_VERSION = 1;
/**
 * The kernel refuses longer request lines (and then closes the connection), so the
 * client refuses to send them and keeps the connection usable instead.
 */
export declare const MAX_LINE_BYTES: number;
/** A `code.exec` may carry up to 64 MiB of inputs (the kernel reads one such line at a time). */
export declare const MAX_EXEC_LINE_BYTES: number;
/** The stable strings of `data.kind` in the kernel's error answers. */
export type ErrorKind = "parse_error" | "invalid_request" | "too_large" | "unknown_method" | "invalid_params" | "unauthenticated" | "denied" | "not_found" | "run_exited" | "provider_error" | "no_provider" | "tool_error" | "budget_exhausted" | "internal" | "cancelled" | "would_block";
/** `data.kind` for each error code, used when an error arrives without one. */
export declare const ERROR_KINDS: Readonly<Record<number, ErrorKind>>;
/**
 * The kernel answered a syscall with an error.
 *
 * `code` is the JSON-RPC code, `kind` the stable string from `data.kind` (match on this,
 * e.g. `err.kind === "budget_exhausted"`), `message` the kernel's explanation, `data`
 * the whole `data` member, and `method` the syscall that failed.
 */
export declare class KeelError extends Error {
    readonly name = "KeelError";
    readonly code: number;
    /** An {@link ErrorKind}, or `"unknown"` for a code this SDK does not know. */
    readonly kind: ErrorKind | "unknown" | (string & {});
    readonly data: unknown;
    readonly method: string | undefined;
    constructor(code: number, message: string, data?: unknown, method?: string);
    /** `"<method> failed: <message> [<kind>, code <code>]"`. */
    describe(): string;
    toString(): string;
}
/**
 * The connection to the kernel is gone (or could not be made). Calls in flight and every
 * later call reject with this. Under Keel the right reaction is usually to exit: if the
 * kernel crashed, it restarts the agent and replays.
 */
export declare class ConnectionLost extends Error {
    readonly name = "ConnectionLost";
}
/** The kernel said something this SDK does not understand (a bug on one side). */
export declare class ProtocolError extends Error {
    readonly name = "ProtocolError";
}
/** `KEEL_SOCKET` or `KEEL_RUN_TOKEN` is missing: the program was not started by Keel. */
export declare class NotUnderKeel extends Error {
    readonly name = "NotUnderKeel";
    constructor(detail?: string);
}
/** No answer came within a call's `timeoutMs`; the connection stays usable. */
export declare class TimeoutError extends Error {
    readonly name = "TimeoutError";
}
/** A chat message in the OpenAI chat shape. */
export interface ChatMessage {
    role: "system" | "user" | "assistant" | "tool";
    /** May be null on an assistant message that only carries tool calls. */
    content: string | null;
    tool_calls?: ToolCallRequest[];
    tool_call_id?: string;
    name?: string;
}
/** A tool call the model asked for, in the OpenAI shape. */
export interface ToolCallRequest {
    id: string;
    type: "function";
    function: {
        name: string;
        arguments: string;
    };
}
export interface LlmChatOptions {
    model?: string;
    /** Tools the model may call, in the OpenAI shape (`{type: "function", function: {...}}`). */
    tools?: readonly unknown[];
    maxTokens?: number;
    temperature?: number;
    /** `"auto"`, `"none"`, `"required"` or `{type: "function", function: {name}}`. */
    toolChoice?: unknown;
    stop?: readonly string[];
    topP?: number;
    /** OpenAI shape (`{type: "json_object"}`, `{type: "json_schema", ...}`). */
    responseFormat?: unknown;
    /** `false` asks for at most one tool call per response. */
    parallelToolCalls?: boolean;
}
export interface LlmChatResult {
    message: {
        role: "assistant";
        content: string | null;
        tool_calls?: ToolCallRequest[];
    };
    usage: {
        input_tokens: number;
        output_tokens: number;
    };
    cost_usd: number;
    model: string;
    /** `stop`, `length`, `tool_calls` or `content_filter`. */
    finish_reason?: string;
}
export interface LlmEmbedResult {
    model: string;
    /** One vector per input, in order. */
    embeddings: number[][];
    input_tokens: number;
}
export interface ToolSpec {
    name: string;
    description: string;
    input_schema: unknown;
}
export interface ExecLimits {
    timeout_ms?: number;
    memory_bytes?: number;
    max_tool_calls?: number;
    max_output_bytes?: number;
    max_recursion?: number;
}
export interface ExecOptions {
    /** `python` (monty, the default), `javascript` (QuickJS) or `cpython`. */
    lang?: "python" | "javascript" | "cpython" | (string & {});
    /** Bound as the program's global variables. */
    inputs?: Record<string, unknown>;
    limits?: ExecLimits;
}
export interface CodeExecResult {
    result: unknown;
    stdout: string;
    tool_calls: {
        name: string;
        args: unknown;
        ok: boolean;
        duration_us: number;
    }[];
    duration_us: number;
}
export interface SpawnOptions {
    /** The child's program and arguments (run in this run's working directory and sandbox). */
    command?: readonly string[];
    /** Or the name of an agent tool (`[[tools.agent]]` in keel.toml). */
    agent?: string;
    /** The child's input (its `keel.input()`). */
    input?: unknown;
    env?: Record<string, string>;
    /** Tool patterns, each within this run's grant; default: this run's grant. */
    grant?: readonly string[];
    /** `high`, `normal` or `low`; default: this run's. */
    priority?: "high" | "normal" | "low";
    /** The child's own budget (`max_usd`, `max_tokens`, ...), the same shape as a run's. */
    budget?: Record<string, unknown>;
}
export interface WaitResult {
    run_id: string;
    state?: string;
    output?: unknown;
    error?: string | null;
    exit_code?: number | null;
    /** Set when `timeoutMs` passed before the child ended. */
    timed_out?: boolean;
    [field: string]: unknown;
}
export interface ThreadEntry {
    index: number;
    role: string;
    content: string;
}
export interface MemSearchHit {
    key: string;
    /** Higher is more relevant; comparable within one search only. */
    score: number;
    /** An excerpt around the matched words, which are in `[...]`. */
    snippet: string;
}
/** A received message. */
export interface IpcMessage<T = unknown> {
    /** The sending run's id, or null for an operator's message. */
    from: string | null;
    seq: number;
    message: T;
    correlation_id?: string;
    /** The topic, for a message published on one (`"signal"` for signals). */
    topic?: string;
}
export interface ConnectOptions {
    /** Default: `KEEL_SOCKET`. */
    socketPath?: string;
    /** Default: `KEEL_RUN_TOKEN`. */
    token?: string;
}
export interface CallOptions {
    /** Give up waiting after this many milliseconds ({@link TimeoutError}); default: wait
     * forever (`human.ask` may legitimately take hours). */
    timeoutMs?: number;
    /** Give up waiting when this aborts (the promise rejects with the signal's reason). */
    signal?: AbortSignal;
}
/** {@link Client.ask} with a form: the person fills in a form instead of typing text. */
export interface AskFormOptions extends CallOptions {
    /** A JSON schema of an object (`{"type": "object", "properties": ...}`), within the
     * subset tool parameters use; the answer is checked against it by the kernel. */
    form: Record<string, unknown>;
}
/** A table cell. */
export type UiCell = string | number | boolean | null;
/** A chart's series: one value per label. */
export interface UiSeries {
    name: string;
    values: number[];
}
/** A block {@link Client.show} puts on the run's console page (`ui.show`). */
export type UiBlock = {
    type: "table";
    title?: string;
    columns: string[];
    rows: UiCell[][];
} | {
    type: "chart";
    title?: string;
    kind: "line" | "bar";
    labels: string[];
    series: UiSeries[];
} | {
    type: "markdown";
    text: string;
} | {
    type: "progress";
    value: number;
    label?: string;
} | {
    type: "form";
    id: string;
    title?: string;
    schema: Record<string, unknown>;
};
/** The run's input (`keel run --input JSON`; an agent called as a tool or spawned gets its
 * arguments there), or `defaultValue` when it has none. */
export declare function input<T = unknown>(defaultValue?: T): T;
/**
 * Connect to the kernel and say hello.
 *
 * Reads `KEEL_SOCKET` and `KEEL_RUN_TOKEN` from the environment unless given. Rejects
 * with {@link NotUnderKeel} when they are missing, {@link ConnectionLost} when the socket
 * cannot be reached, and {@link KeelError} (kind `unauthenticated`) when the token is
 * refused.
 */
export declare function connect(options?: ConnectOptions): Promise<Client>;
/**
 * A connection to the kernel. Build one with {@link connect}. Each method is one
 * syscall and returns a promise of its answer; any number of calls may be in flight at
 * once, and each gets its own answer.
 *
 * The connection keeps the process alive only while a call is in flight, so a program
 * ends when its work is done even if it never calls {@link Client.close}.
 */
export declare class Client {
    #private;
    /** The run's id, as the kernel's `hello` said. */
    runId: string;
    /** The protocol the kernel speaks (always {@link PROTOCOL_VERSION} once connected). */
    protocol: number;
    private constructor();
    /** See {@link connect}. */
    static connect(options?: ConnectOptions): Promise<Client>;
    /**
     * Send one request and return its `result` (an object for every protocol-1 method).
     * Rejects with {@link KeelError} for an error answer, {@link ConnectionLost} when the
     * connection goes, {@link TimeoutError} after `timeoutMs`.
     */
    call<T = unknown>(method: string, params?: Record<string, unknown>, options?: CallOptions): Promise<T>;
    /** Ask the LLM (OpenAI chat shape). Returns the whole result: `message`, `usage`
     * (`input_tokens`, `output_tokens`), `cost_usd` and `model`. */
    llmChat(messages: readonly ChatMessage[], options?: LlmChatOptions): Promise<LlmChatResult>;
    /** Vectors for `input` from the kernel's embedder (`llm.embed`), journaled like a read. */
    embed(input: readonly string[], options?: {
        model?: string;
    }): Promise<LlmEmbedResult>;
    /** Call a tool and return its result: `await k.tool("kv.put", { key: "k", value: 1 })`. */
    tool<T = unknown>(name: string, args?: Record<string, unknown>): Promise<T>;
    /** The tools this run may call: `name`, `description`, `input_schema`. */
    listTools(): Promise<ToolSpec[]>;
    /**
     * Run a short program whose tool calls are governed, journaled syscalls (`code.exec`).
     *
     * Tools are functions inside it (`fs.read(path="a.txt")` in Python,
     * `fs.read({path: "a.txt"})` in JavaScript); `inputs` are its global variables. A
     * failing program rejects with a {@link KeelError} whose `data.exec_error` says how it
     * failed (`syntax`, `runtime`, `timeout`, `memory`, `tool_call_limit`...).
     */
    exec(code: string, options?: ExecOptions): Promise<CodeExecResult>;
    /**
     * Start a child run (`proc.spawn`) and return its run id: `spawn(["node", "child.js"])`
     * or `spawn({ agent: "researcher", input: {...} })`. Retried after a crash, the call
     * returns the same child. Stopping this run stops its children.
     */
    spawn(command: readonly string[], options?: Omit<SpawnOptions, "command">): Promise<string>;
    spawn(options: SpawnOptions): Promise<string>;
    /** Wait for a child run to end: `{run_id, state, output, error, exit_code}`, or
     * `{timed_out: true, ...}` after `timeoutMs`. Journaled: after a crash the wait
     * answers the same. */
    wait(runId: string, options?: {
        timeoutMs?: number;
    }): Promise<WaitResult>;
    /** `stop`, `pause` or `resume` a descendant run (or send it a custom signal). */
    signal(runId: string, signal: string): Promise<Record<string, unknown>>;
    /** Take `name` in this run's tenant: other runs `send(name, ...)` to it while this run
     * lives (`ipc.register`). A name held by a live run rejects with kind `denied`. */
    register(name: string): Promise<void>;
    /** A durable timer: after a crash the run sleeps only what was left (`sys.sleep`). */
    sleep(ms: number): Promise<void>;
    /** Save `state` (any JSON); after a crash, {@link Client.restore} returns it and replay
     * starts here. Returns the checkpoint's sequence number. */
    checkpoint(state: unknown): Promise<number>;
    /** The last checkpointed state, or null on a fresh run. */
    restore<T = unknown>(): Promise<T | null>;
    /** Wall-clock time in Unix milliseconds, journaled (use instead of `Date.now()`). */
    nowMs(): Promise<number>;
    /** A no-op round trip to the kernel (not journaled): checks the channel is alive. */
    ping(): Promise<void>;
    /** A random unsigned 64-bit integer, journaled (use instead of `Math.random()`). A
     * `bigint`, since a JS number cannot hold every u64. */
    random(): Promise<bigint>;
    /** Ask a human and wait (durably, maybe for hours) for `keel answer`; resolves to the
     * answer's text. With `form` (a JSON schema of an object), the person fills in a form
     * (`keel answer RUN --json '{...}'`, or the console) and this resolves to the
     * structured value, which the kernel has checked against the form. */
    ask(question: string, options?: CallOptions): Promise<string>;
    ask<T = Record<string, unknown>>(question: string, options: AskFormOptions): Promise<T>;
    /** Show `block` on the run's console page (`ui.show`). Journaled: after a crash a
     * replayed call is not shown twice. Resolves to the block's sequence number; a bad
     * block rejects with kind `invalid_params`, naming the field. */
    show(block: UiBlock): Promise<number>;
    /** A table: each row has one cell per column. */
    showTable(columns: string[], rows: UiCell[][], title?: string): Promise<number>;
    /** A `line` or `bar` chart: each series has one value per label (a record of name to
     * values is taken too). */
    showChart(kind: "line" | "bar", labels: string[], series: UiSeries[] | Record<string, number[]>, title?: string): Promise<number>;
    /** A markdown text. */
    showMarkdown(text: string): Promise<number>;
    /** Progress from 0 to 1, with an optional label. */
    showProgress(value: number, label?: string): Promise<number>;
    /** A form (`schema`: a JSON schema of an object) the person fills in on the console. The
     * submitted value arrives in the run's mailbox as an operator message
     * `{ui_form: id, value: {...}}`: receive it with {@link Client.recv}. To wait for one
     * answer, `ask(question, {form})` is simpler. */
    showForm(id: string, schema: Record<string, unknown>, title?: string): Promise<number>;
    /** Publish an event (any JSON) on the run's event stream. */
    emit(event: unknown): Promise<void>;
    /** Finish the run with `output` (any JSON). Later calls reject with kind `run_exited`;
     * the program should end after this. */
    exit(output?: unknown): Promise<void>;
    /** Append a message to the conversation thread `thread` (shared by id between the runs
     * of a tenant; created on first append). Returns its index (0 first). */
    threadAppend(thread: string, role: string, content: string): Promise<number>;
    /** The thread's messages, oldest first: the newest `last` of them and/or the newest that
     * fit in `maxTokens` (estimated). */
    threadRead(thread: string, options?: {
        last?: number;
        maxTokens?: number;
    }): Promise<ThreadEntry[]>;
    /** Store `value` (any JSON) under `namespace`/`key` in long-term memory. `text` is what
     * {@link Client.memSearch} finds it by (default: the value itself, or its JSON). */
    memPut(namespace: string, key: string, value: unknown, options?: {
        text?: string;
    }): Promise<void>;
    /** The value stored under `namespace`/`key`, or null. */
    memGet<T = unknown>(namespace: string, key: string): Promise<T | null>;
    /** Delete a record; whether there was one. */
    memDelete(namespace: string, key: string): Promise<boolean>;
    /** Search a namespace: hits (`key`, `score`, `snippet`), most relevant first. `mode` is
     * `"text"` (full-text, the default), `"semantic"` or `"hybrid"`. */
    memSearch(namespace: string, query: string, options?: {
        limit?: number;
        mode?: "text" | "semantic" | "hybrid";
    }): Promise<MemSearchHit[]>;
    /**
     * Put `message` (any JSON) in the mailbox of run `to` (a run of the same tenant, or a
     * registered name) and return its seq there. When the mailbox is full this waits for
     * room, or with `wait: false` rejects with kind `would_block` (nothing was sent).
     */
    send(to: string, message: unknown, options?: {
        correlationId?: string;
        wait?: boolean;
    }): Promise<number>;
    /**
     * {@link Client.send}, then {@link Client.recv}, in one call: the next message of this
     * run's mailbox after the send (the reply, when the peer answers at once), or null when
     * `timeoutMs` passes first. Journaled and replayed as the two calls. The receive is on
     * offer before the peer hears of the send, so the peer's reply completes it in the
     * reply's own commit: a request/reply round trip of two commits.
     */
    sendRecv<T = unknown>(to: string, message: unknown, options?: {
        correlationId?: string;
        timeoutMs?: number;
    }): Promise<IpcMessage<T> | null>;
    /** The next message of this run's mailbox, waiting up to `timeoutMs` (forever when
     * absent); null on timeout. Each message is received once, and a restarted run
     * receives the same messages again. */
    recv<T = unknown>(options?: {
        timeoutMs?: number;
    }): Promise<IpcMessage<T> | null>;
    /** Up to `max` (1 to 1000) of the oldest messages of this run's mailbox, oldest first:
     * at least one, waiting up to `timeoutMs` (forever when absent) for the first; empty on
     * timeout. Whatever is waiting is taken in one journaled step (one commit for the
     * batch, where `recv` makes one per message). Past the first message, a batch stops
     * before the messages' bodies exceed 1 MiB of JSON in all. */
    recvMany<T = unknown>(max: number, options?: {
        timeoutMs?: number;
    }): Promise<IpcMessage<T>[]>;
    /** Deliver messages published on the tenant's `topic` to this run's mailbox from now on. */
    subscribe(topic: string): Promise<void>;
    /** Stop delivering `topic`'s messages to this run. */
    unsubscribe(topic: string): Promise<void>;
    /** Put `message` in the mailbox of every run of the tenant subscribed to `topic` (all or
     * nothing); returns how many got it. */
    publish(topic: string, message: unknown, options?: {
        wait?: boolean;
    }): Promise<number>;
    /** Close the connection. Calls still waiting reject with {@link ConnectionLost}.
     * Idempotent. */
    close(): void;
}
