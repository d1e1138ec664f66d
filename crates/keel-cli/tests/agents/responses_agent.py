"""An unmodified OpenAI SDK program on the Responses API (`client.responses`): it only
knows OPENAI_BASE_URL and OPENAI_API_KEY, which `keel run` points at the kernel's
gateway. A plain call, a streamed one, a tool round trip continued with
`previous_response_id`, reading a response back, and requests the gateway must refuse.
Prints one JSON line with what it saw."""

import json

import openai

client = openai.OpenAI()
out = {}

reply = client.responses.create(model="gpt-4o-mini", input="say hello", instructions="be brief", max_output_tokens=50)
out["plain"] = reply.output_text
out["plain_usage"] = [reply.usage.input_tokens, reply.usage.output_tokens]
out["plain_status"] = reply.status

events, text, completed = [], [], None
with client.responses.create(model="gpt-4o-mini", input=[{"role": "user", "content": "stream a poem"}], stream=True) as stream:
    for event in stream:
        events.append(event.type)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        if event.type == "response.completed":
            completed = event.response
out["streamed"] = "".join(text)
out["stream_final"] = completed.output_text
out["stream_events"] = sorted(set(events))
out["stream_first_last"] = [events[0], events[-1]]

tools = [{"type": "function", "name": "add", "description": "add two numbers",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                         "required": ["a", "b"], "additionalProperties": False}, "strict": True}]
first = client.responses.create(model="gpt-4o-mini", input="what is 2 plus 3? use the tool", tools=tools)
call = next(item for item in first.output if item.type == "function_call")
args = json.loads(call.arguments)
final = client.responses.create(
    model="gpt-4o-mini",
    previous_response_id=first.id,
    input=[{"type": "function_call_output", "call_id": call.call_id, "output": str(args["a"] + args["b"])}],
    tools=tools,
)
out["tool_call"] = [call.name, args]
out["final"] = final.output_text
out["final_previous"] = final.previous_response_id == first.id
out["retrieved"] = client.responses.retrieve(first.id).id == first.id


def refusal(**kwargs):
    try:
        client.responses.create(model="gpt-4o-mini", **kwargs)
        return "accepted"
    except openai.APIStatusError as err:
        return [err.status_code, (err.body or {}).get("param")]


out["unknown_call_id"] = refusal(input=[{"type": "function_call_output", "call_id": "call_nope", "output": "1"}])
out["web_search"] = refusal(input="x", tools=[{"type": "web_search"}])
out["image"] = refusal(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}])
out["unknown_previous"] = refusal(input="x", previous_response_id="resp_nope")
try:
    client.responses.retrieve("resp_nope")
    out["retrieve_unknown"] = "found"
except openai.NotFoundError as err:
    out["retrieve_unknown"] = err.status_code
print(json.dumps(out))
