"""Test agent for AG-UI streams: asks "Go ahead?", then makes one LLM call (the script
in `agui_script.json`: text streamed in two chunks and a proposed `echo` call), makes
that `echo` call, checkpoints its state and exits.

Its input may be an AG-UI RunAgentInput (`POST /v1/agui`): the last user message is
what it sends the model, and its output names the input's thread.

Output: {"answer": "<the text>", "reply": "<the model's text>", "echoed": {...},
"thread": "<threadId or null>"}.
"""

from __future__ import annotations

import json

import keel

given = keel.input() or {}
said = [m.get("content") for m in given.get("messages", []) if m.get("role") == "user"]
with keel.connect() as k:
    answer = k.ask("Go ahead?")
    reply = k.llm_chat([{"role": "user", "content": said[-1] if said else "what is the weather?"}])
    call = reply["message"]["tool_calls"][0]
    echoed = k.tool(call["function"]["name"], json.loads(call["function"]["arguments"]))
    k.checkpoint({"step": "checked", "answer": answer})
    k.exit(
        {
            "answer": answer,
            "reply": reply["message"]["content"],
            "echoed": echoed,
            "thread": given.get("threadId"),
        }
    )
