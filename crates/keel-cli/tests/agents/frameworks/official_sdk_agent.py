"""An unmodified program on the official `openai` and `anthropic` Python packages: they
read OPENAI_BASE_URL / OPENAI_API_KEY and ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY, which
`keel run` points at the kernel. One tool round trip over Chat Completions
(AGENT_API=chat, the default), the Responses API (AGENT_API=responses) or Anthropic's
Messages API (AGENT_API=messages). The `add` tool sleeps AGENT_TOOL_DELAY_MS so a test can
kill the kernel between the two LLM calls. Prints one JSON line with what it saw."""

import json
import os
import time

API = os.environ.get("AGENT_API", "chat")
DELAY = int(os.environ.get("AGENT_TOOL_DELAY_MS", "0")) / 1000
QUESTION = "What is 2 + 3? Use the add tool."
PARAMETERS = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}
tool_results = []


def add(a, b):
    time.sleep(DELAY)
    tool_results.append(a + b)
    return a + b


def chat():
    import openai

    client = openai.OpenAI(max_retries=0)
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": PARAMETERS}}]
    messages = [{"role": "user", "content": QUESTION}]
    while True:
        message = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools).choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = add(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})


def responses():
    import openai

    client = openai.OpenAI(max_retries=0)
    tools = [{"type": "function", "name": "add", "description": "Add two numbers.", "parameters": PARAMETERS}]
    items = [{"role": "user", "content": QUESTION}]
    while True:
        response = client.responses.create(model="gpt-4o-mini", input=items, tools=tools)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return response.output_text
        items += [item.model_dump(exclude_none=True) for item in response.output]
        for call in calls:
            result = add(**json.loads(call.arguments))
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": str(result)})


def messages():
    import anthropic

    client = anthropic.Anthropic(max_retries=0)
    tools = [{"name": "add", "description": "Add two numbers.", "input_schema": PARAMETERS}]
    history = [{"role": "user", "content": QUESTION}]
    while True:
        reply = client.messages.create(model="claude-haiku-4-5", max_tokens=256, messages=history, tools=tools)
        calls = [block for block in reply.content if block.type == "tool_use"]
        if not calls:
            return "".join(block.text for block in reply.content if block.type == "text")
        history.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]})
        history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": str(add(**call.input))} for call in calls
        ]})


answer = {"chat": chat, "responses": responses, "messages": messages}[API]()
print(json.dumps({"framework": "official-sdks", "api": API, "answer": answer, "tool_results": tool_results}))
