// An unmodified program on the official `openai` npm package: it only knows OPENAI_BASE_URL
// and OPENAI_API_KEY, which `keel run` points at the kernel's gateway. One tool round trip
// over Chat Completions (AGENT_API=chat, the default) or the Responses API
// (AGENT_API=responses); the `add` tool sleeps AGENT_TOOL_DELAY_MS so a test can kill the
// kernel between the two LLM calls. Prints one JSON line with what it saw.
import OpenAI from "openai";

const client = new OpenAI({ maxRetries: 0 });
const delayMs = Number(process.env.AGENT_TOOL_DELAY_MS ?? "0");
const question = "What is 2 + 3? Use the add tool.";
const parameters = {
  type: "object",
  properties: { a: { type: "number" }, b: { type: "number" } },
  required: ["a", "b"],
};
const toolResults = [];

async function add({ a, b }) {
  await new Promise((resolve) => setTimeout(resolve, delayMs));
  toolResults.push(a + b);
  return a + b;
}

async function chat() {
  const tools = [{ type: "function", function: { name: "add", description: "Add two numbers.", parameters } }];
  const messages = [{ role: "user", content: question }];
  for (;;) {
    const reply = await client.chat.completions.create({ model: "gpt-4o-mini", messages, tools });
    const message = reply.choices[0].message;
    if (!message.tool_calls?.length) return message.content;
    messages.push(message);
    for (const call of message.tool_calls) {
      const result = await add(JSON.parse(call.function.arguments));
      messages.push({ role: "tool", tool_call_id: call.id, content: String(result) });
    }
  }
}

async function responses() {
  const tools = [{ type: "function", name: "add", description: "Add two numbers.", parameters }];
  const input = [{ role: "user", content: question }];
  for (;;) {
    const response = await client.responses.create({ model: "gpt-4o-mini", input, tools });
    const calls = response.output.filter((item) => item.type === "function_call");
    if (calls.length === 0) return response.output_text;
    input.push(...response.output);
    for (const call of calls) {
      const result = await add(JSON.parse(call.arguments));
      input.push({ type: "function_call_output", call_id: call.call_id, output: String(result) });
    }
  }
}

const api = process.env.AGENT_API ?? "chat";
const answer = api === "responses" ? await responses() : await chat();
console.log(JSON.stringify({ framework: "openai-npm", api, answer, tool_results: toolResults }));
