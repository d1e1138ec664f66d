"""An unmodified OpenAI and Anthropic SDK program that lists the gateway's models and asks
for what it does not serve (a response's input items, deleting a response, a made-up
path): it prints what each SDK reports, one JSON line."""

import json

import anthropic
import openai

out = {}
client = openai.OpenAI()
try:
    client.responses.input_items.list("resp_1")
    out["input_items"] = "served"
except openai.APIStatusError as err:
    out["input_items"] = {"status": err.status_code, "message": str(err.message)}
try:
    client.responses.delete("resp_1")
    out["delete"] = "served"
except openai.APIStatusError as err:
    out["delete"] = {"status": err.status_code, "message": str(err.message)}
out["models"] = [model.id for model in client.models.list()]
out["anthropic_models"] = [model.id for model in anthropic.Anthropic().models.list()]
try:
    client.get("/files", cast_to=object)
    out["files"] = "served"
except openai.APIStatusError as err:
    out["files"] = {"status": err.status_code, "message": str(err.message)}
try:
    anthropic.Anthropic().get("/v1/files", cast_to=object)
    out["anthropic_files"] = "served"
except anthropic.APIStatusError as err:
    out["anthropic_files"] = {"status": err.status_code, "type": err.body["error"]["type"]}
print(json.dumps(out))
