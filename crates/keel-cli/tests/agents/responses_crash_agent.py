"""A tool round trip on the Responses API across a daemon SIGKILL: the first call is
streamed, the tool sleeps RESPONSES_TOOL_DELAY_MS (the test kills the kernel then), and
the follow-up continues with `previous_response_id`. After the restart the agent runs
again from the top: the first call is answered from the journal (as the same stream,
with the same response id) and the follow-up still finds it. Prints one JSON line."""

import json
import os
import time

import openai

client = openai.OpenAI()
tools = [{"type": "function", "name": "add", "description": "add two numbers",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}]
events, first = [], None
with client.responses.create(model="gpt-4o-mini", input="what is 2 plus 3? use the tool", tools=tools, stream=True) as stream:
    for event in stream:
        events.append(event.type)
        if event.type == "response.completed":
            first = event.response
call = next(item for item in first.output if item.type == "function_call")
args = json.loads(call.arguments)
time.sleep(int(os.environ.get("RESPONSES_TOOL_DELAY_MS", "0")) / 1000)
final = client.responses.create(
    model="gpt-4o-mini",
    previous_response_id=first.id,
    input=[{"type": "function_call_output", "call_id": call.call_id, "output": str(args["a"] + args["b"])}],
    tools=tools,
)
print(json.dumps({"first_id": first.id, "events": events, "final": final.output_text}))
