// An unmodified Vercel AI SDK agent (`ai` + `@ai-sdk/openai`): the default `openai`
// provider reads OPENAI_BASE_URL and OPENAI_API_KEY, which `keel run` points at the
// kernel's gateway. `openai(model)` is the Responses API (the SDK's default);
// AGENT_API=chat picks `openai.chat(model)`. AGENT_OPENAI_STORE=false sets the provider's
// documented `store: false` option (the default, true, sends earlier assistant text back
// as `item_reference`s). One tool round trip; the `add` tool sleeps AGENT_TOOL_DELAY_MS so
// a test can kill the kernel between the two LLM calls. Prints one JSON line with what it
// saw.
import { openai } from "@ai-sdk/openai";
import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";

const delayMs = Number(process.env.AGENT_TOOL_DELAY_MS ?? "0");
const api = process.env.AGENT_API ?? "responses";
const toolResults = [];

const add = tool({
  description: "Add two numbers.",
  inputSchema: z.object({ a: z.number(), b: z.number() }),
  execute: async ({ a, b }) => {
    await new Promise((resolve) => setTimeout(resolve, delayMs));
    toolResults.push(a + b);
    return a + b;
  },
});

const result = await generateText({
  model: api === "chat" ? openai.chat("gpt-4o-mini") : openai("gpt-4o-mini"),
  tools: { add },
  stopWhen: stepCountIs(5),
  maxRetries: 0,
  ...(process.env.AGENT_OPENAI_STORE === "false" && { providerOptions: { openai: { store: false } } }),
  prompt: "What is 2 + 3? Use the add tool.",
});
console.log(JSON.stringify({ framework: "vercel-ai", api, answer: result.text, steps: result.steps.length, tool_results: toolResults }));
