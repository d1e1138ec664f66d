"""An unmodified OpenAI SDK program on the Responses API whose run's model is served by
whatever provider the kernel routes it to (the test: Anthropic). A plain call and a
streamed one, then a call with `store: false`, which the kernel must not keep: reading
it back or continuing from it is a 404. Prints one JSON line."""

import json

import openai

client = openai.OpenAI(max_retries=0)
out = {}
reply = client.responses.create(model="claude-haiku-4-5", input="say hello")
out["plain"] = reply.output_text.strip()
text = []
with client.responses.create(model="claude-haiku-4-5", input="stream a poem", stream=True) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            text.append(event.delta)
out["streamed"] = "".join(text).strip()
unstored = client.responses.create(model="claude-haiku-4-5", input="one more", store=False)
out["unstored_text"] = unstored.output_text.strip()
try:
    client.responses.retrieve(unstored.id)
    out["unstored_retrieve"] = "found"
except openai.NotFoundError as err:
    out["unstored_retrieve"] = err.status_code
try:
    client.responses.create(model="claude-haiku-4-5", input="and then", previous_response_id=unstored.id)
    out["unstored_continue"] = "accepted"
except openai.NotFoundError as err:
    out["unstored_continue"] = [err.status_code, (err.body or {}).get("param")]
out["stored_retrieve"] = client.responses.retrieve(reply.id).output_text.strip()
print(json.dumps(out))
