"""Test agent for traces: an LLM call, two tool calls (one failing), an LLM call through
the gateway carrying a W3C `traceparent` of its own span under the run's, then (with
input {"ask": true}) a question that parks the run, and a last LLM call.

Output: {"traceparent": TRACEPARENT as the agent saw it, "gateway_parent": the span id
it sent, "replies": [...], "tool_error": KIND}.
"""

from __future__ import annotations

import json
import os
import urllib.request

import keel

plan = keel.input({"ask": False})
out = {"traceparent": os.environ.get("TRACEPARENT")}
with keel.connect() as k:
    replies = [k.llm_chat([{"role": "user", "content": "make a plan, secret-prompt-text"}], model="scripted-model")["message"]["content"]]
    k.tool("echo", {"text": "hi"})
    try:
        k.tool("fs.read", {"path": "no/such/file.txt"})
    except keel.KeelError as err:
        out["tool_error"] = err.kind
    # A framework's own span, child of the run's: the gateway call nests under it.
    headers = {"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    if out["traceparent"]:
        trace = out["traceparent"].split("-")[1]
        out["gateway_parent"] = "00f067aa0ba902b7"
        headers["traceparent"] = f"00-{trace}-{out['gateway_parent']}-01"
    body = json.dumps({"model": "scripted-model", "messages": [{"role": "user", "content": "through the gateway"}]})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body.encode(), headers=headers
    )
    with urllib.request.urlopen(request) as response:
        replies.append(json.load(response)["choices"][0]["message"]["content"])
    if plan.get("ask"):
        out["answer"] = k.ask("go on?")
    replies.append(k.llm_chat([{"role": "user", "content": "wrap up"}])["message"]["content"])
    out["replies"] = replies
    k.exit(out)
