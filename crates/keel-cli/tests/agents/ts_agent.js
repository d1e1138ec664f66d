// Test agent in Node, on the TypeScript SDK (`require("keel")` through the NODE_PATH that
// `keel run` sets): six LLM calls with a tool call and a checkpoint after the third.
//
// Used by the end-to-end tests (`tests/it/typescript.rs`) in the default sandbox and
// across daemon SIGKILLs. Run with `--llm-script crash_script.json` (ordered replies
// "reply 1", "reply 2"...).
//
// - Restores first: a fresh run calls `sys.now` and `sys.random` once each (the u64 as a
//   bigint); a resumed run takes them, the replies so far and the step from the checkpoint.
// - Call N sends "step N of 6", keeps the reply's content and emits {step, reply}.
// - After call 3: `kv.put` of the replies so far, then a checkpoint of the whole state.
// - Env `TS_AGENT_DELAY_MS` (default 0): wait this long after every call (a timer, not a
//   syscall), so a test can kill the kernel between two calls.
// - Then two `echo` calls in flight together, and `run.exit` with {replies, random, now,
//   echoed, tools, node_path}; `random` is written as the exact JSON integer.
"use strict";

const keel = require("keel");

const STEPS = 6;
const CHECKPOINT_AFTER = 3;

function log(text) {
  process.stderr.write(`ts_agent: ${text}\n`);
}

async function main() {
  const delayMs = Number(process.env.TS_AGENT_DELAY_MS ?? "0");
  const k = await keel.connect();
  let state = await k.restore();
  if (state === null) {
    state = { step: 0, replies: [], now: await k.nowMs(), random: await k.random() };
    log(`fresh start: now=${state.now} random=${state.random}`);
  } else {
    // JSON integers up to 2^53 come back as numbers, larger ones as bigints.
    state.random = BigInt(state.random);
    log(`resumed from checkpoint at step ${state.step}`);
  }
  for (let step = state.step + 1; step <= STEPS; step++) {
    const reply = await k.llmChat([{ role: "user", content: `step ${step} of ${STEPS}` }], { maxTokens: 32 });
    state.replies.push(reply.message.content);
    state.step = step;
    await k.emit({ step, reply: reply.message.content });
    log(`step ${step}/${STEPS} -> ${JSON.stringify(reply.message.content)}`);
    if (step === CHECKPOINT_AFTER) {
      await k.tool("kv.put", { key: "half", value: state.replies });
      log(`checkpoint seq ${await k.checkpoint(state)}`);
    }
    if (delayMs > 0) {
      await new Promise((resolve) => setTimeout(resolve, delayMs));
    }
  }
  const echoed = await Promise.all([k.tool("echo", { part: 1 }), k.tool("echo", { part: 2 })]);
  const tools = (await k.listTools()).map((tool) => tool.name).sort();
  const output = {
    replies: state.replies,
    random: state.random,
    now: state.now,
    echoed,
    tools,
    node_path: process.env.NODE_PATH,
  };
  await k.exit(output);
  console.log(`ts_agent: done after ${state.step} steps`);
}

main().catch((err) => {
  log(String(err));
  process.exit(1);
});
