"""Streams one reply through each SDK (OpenAI and Anthropic), then sleeps
STREAM_AGENT_DELAY_MS so a test can kill the kernel, then streams once more. After a
restart the first two calls are answered from the journal, rendered as streams."""

import json
import os
import time

import anthropic
import openai

openai_client = openai.OpenAI()
anthropic_client = anthropic.Anthropic()


def openai_stream(prompt):
    chunks = openai_client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}], stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def anthropic_stream(prompt):
    with anthropic_client.messages.stream(
        model="claude-3-5-haiku-latest", max_tokens=64, messages=[{"role": "user", "content": prompt}]
    ) as stream:
        return "".join(stream.text_stream)


first = openai_stream("say hello")
second = anthropic_stream("stream a poem")
print("streamed twice", flush=True)
time.sleep(int(os.environ.get("STREAM_AGENT_DELAY_MS", "0")) / 1000)
third = openai_stream("one more")
print(json.dumps({"first": first, "second": second, "third": third}))
