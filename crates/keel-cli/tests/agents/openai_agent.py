"""An unmodified OpenAI SDK program: it only knows OPENAI_BASE_URL and OPENAI_API_KEY,
which `keel run` points at the kernel's gateway. Non-streaming, streaming (with usage) and
a tool-call round trip. Prints one JSON line with what it saw."""

import json

import openai

client = openai.OpenAI()
out = {}

reply = client.chat.completions.create(
    model="gpt-4o-mini", messages=[{"role": "user", "content": "say hello"}], max_tokens=50
)
out["plain"] = reply.choices[0].message.content
out["plain_usage"] = [reply.usage.prompt_tokens, reply.usage.completion_tokens]

chunks = client.chat.completions.create(
    model="gpt-4o-mini",
    messages=[{"role": "user", "content": "stream a poem"}],
    stream=True,
    stream_options={"include_usage": True},
)
text, usage = [], None
for chunk in chunks:
    if chunk.usage is not None:
        usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
    for choice in chunk.choices:
        if choice.delta.content:
            text.append(choice.delta.content)
out["streamed"] = "".join(text)
out["stream_usage"] = usage

tools = [{"type": "function", "function": {"name": "add", "description": "add two numbers",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]
messages = [{"role": "user", "content": "what is 2 plus 3? use the tool"}]
first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)
call = first.choices[0].message.tool_calls[0]
args = json.loads(call.function.arguments)
messages.append(first.choices[0].message.model_dump(exclude_none=True))
messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
final = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)
out["tool_call"] = [call.function.name, args]
out["finish_reasons"] = [first.choices[0].finish_reason, final.choices[0].finish_reason]
out["final"] = final.choices[0].message.content

try:
    openai.OpenAI(api_key="not-a-run-token").chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "say hello"}]
    )
    out["bad_key"] = "accepted"
except openai.AuthenticationError as err:
    out["bad_key"] = type(err).__name__
print(json.dumps(out))
