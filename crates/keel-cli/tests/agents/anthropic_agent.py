"""An unmodified Anthropic SDK program (ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY point at
the kernel). Non-streaming and streaming. Prints one JSON line with what it saw."""

import json

import anthropic

client = anthropic.Anthropic()
out = {}
message = client.messages.create(
    model="claude-3-5-haiku-latest",
    max_tokens=100,
    system="be brief",
    messages=[{"role": "user", "content": "say hello"}],
)
out["plain"] = "".join(block.text for block in message.content if block.type == "text")
out["stop_reason"] = message.stop_reason
out["usage"] = [message.usage.input_tokens, message.usage.output_tokens]

with client.messages.stream(
    model="claude-3-5-haiku-latest", max_tokens=100, messages=[{"role": "user", "content": "stream a poem"}]
) as stream:
    out["streamed"] = "".join(stream.text_stream)
    final = stream.get_final_message()
out["stream_stop_reason"] = final.stop_reason
out["stream_usage"] = [final.usage.input_tokens, final.usage.output_tokens]
print(json.dumps(out))
