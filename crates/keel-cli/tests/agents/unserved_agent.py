"""An unmodified OpenAI and Anthropic SDK program that asks the gateway for what it does
not serve (the Responses API, a model listing): it prints the status and message each
SDK reports, one JSON line."""

import json

import anthropic
import openai

out = {}
client = openai.OpenAI()
try:
    client.responses.create(model="gpt-4o-mini", input="hello")
    out["responses"] = "served"
except openai.APIStatusError as err:
    out["responses"] = {"status": err.status_code, "message": str(err.message)}
try:
    client.models.list()
    out["models"] = "served"
except openai.APIStatusError as err:
    out["models"] = {"status": err.status_code, "message": str(err.message)}
try:
    anthropic.Anthropic().models.list()
    out["anthropic_models"] = "served"
except anthropic.APIStatusError as err:
    out["anthropic_models"] = {"status": err.status_code, "type": err.body["error"]["type"]}
print(json.dumps(out))
