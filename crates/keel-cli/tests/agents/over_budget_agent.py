"""An unmodified OpenAI SDK program whose one request can never fit its run's budget (a
prompt larger than the whole token budget), on the Responses and the Chat Completions
API. Prints the status and message each gets, one JSON line."""

import json

import openai

client = openai.OpenAI(max_retries=0)
big = "word " * 20000
out = {}
for api, call in [
    ("responses", lambda: client.responses.create(model="gpt-4o-mini", input=big)),
    ("chat", lambda: client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": big}])),
]:
    try:
        call()
        out[api] = "accepted"
    except openai.APIStatusError as err:
        out[api] = {"status": err.status_code, "message": str(err.message)}
print(json.dumps(out))
