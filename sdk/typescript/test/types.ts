// Compiled, never run: the published declarations (dist/index.d.ts) type an agent the
// way the README says, and refuse what the kernel would refuse. `scripts/test-typescript`
// type-checks this file with test/tsconfig.json.
import * as keel from "keel";
import { Client, KeelError, type ChatMessage, type IpcMessage, type LlmChatResult } from "keel";

interface State {
  done: number;
  random: bigint;
}

export async function agent(): Promise<void> {
  const k: Client = await keel.connect();
  const state: State = (await k.restore<State>()) ?? { done: 0, random: await k.random() };
  const messages: ChatMessage[] = [{ role: "user", content: `step ${state.done + 1}` }];
  const reply: LlmChatResult = await k.llmChat(messages, { maxTokens: 64, toolChoice: "auto" });
  const text: string | null = reply.message.content;
  const tokens: number = reply.usage.input_tokens + reply.usage.output_tokens;
  await k.tool("kv.put", { key: "reply", value: text });
  const seq: number = await k.checkpoint({ ...state, done: state.done + 1, tokens });
  const child: string = await k.spawn(["node", "child.js"], { input: { seq } });
  const outcome = await k.wait(child, { timeoutMs: 1000 });
  const timedOut: boolean | undefined = outcome.timed_out;
  const message: IpcMessage<{ q: number }> | null = await k.recv<{ q: number }>({ timeoutMs: 10 });
  const q: number | undefined = message?.message.q;
  const answered = await k.sendRecv<{ answer: number }>("run_b", { q }, { correlationId: "c0", timeoutMs: 10 });
  const answer: number | undefined = answered?.message.answer;
  await k.emit({ answer });
  const hits = await k.memSearch("notes", "tides", { mode: "hybrid" });
  const score: number | undefined = hits[0]?.score;
  const now: number = await k.nowMs();
  const deleted: boolean = await k.memDelete("notes", "k");
  await k.emit({ timedOut, q, score, now, deleted });
  try {
    await k.send("run_b", { n: 1 }, { correlationId: "c1", wait: false });
  } catch (err) {
    if (err instanceof KeelError && err.kind === "would_block") {
      const code: number = err.code;
      const method: string | undefined = err.method;
      await k.emit({ code, method });
    } else if (err instanceof keel.ConnectionLost) {
      return;
    }
  }
  const shown: number = await k.showTable(["name", "n"], [["a", 1], [null, true]], "Counts");
  await k.showChart("bar", ["q1", "q2"], [{ name: "revenue", values: [1, 2] }]);
  await k.showProgress(0.5, "half");
  await k.show({ type: "markdown", text: `shown ${shown}` });
  const plain: string = await k.ask("ok?", { timeoutMs: 10 });
  const filled = await k.ask<{ approve: boolean }>("approve?", { form: { type: "object" } });
  const approve: boolean = filled.approve;
  await k.emit({ plain, approve });
  await k.exit({ steps: state.done });
  k.close();
}

export async function refused(k: Client): Promise<void> {
  // @ts-expect-error: a chat message needs a known role
  await k.llmChat([{ role: "robot", content: "hi" }]);
  // @ts-expect-error: options are camelCase
  await k.llmChat([], { max_tokens: 5 });
  // @ts-expect-error: random is a bigint, not a number
  const random: number = await k.random();
  // @ts-expect-error: mem.search modes are text, semantic or hybrid
  await k.memSearch("notes", "q", { mode: "fuzzy" });
  // @ts-expect-error: the command is the first argument or an option, not both
  await k.spawn(["node", "a.js"], { command: ["node", "b.js"] });
  await k.spawn({ agent: "researcher", input: { topic: "tides" } });
  // @ts-expect-error: the client is made by connect(), not new
  new Client();
  // @ts-expect-error: the JSON helpers are internal (stripped from the declarations)
  keel.parseJson("{}");
  // @ts-expect-error: a chart is a line or a bar chart
  await k.showChart("pie", [], []);
  // @ts-expect-error: a block has a known type
  await k.show({ type: "video", url: "x" });
  // @ts-expect-error: a table cell is a string, number, boolean or null
  await k.showTable(["a"], [[{ nested: 1 }]]);
  // @ts-expect-error: a plain question's answer is text
  const answer: number = await k.ask("how many?");
  await k.emit({ random, answer });
}
