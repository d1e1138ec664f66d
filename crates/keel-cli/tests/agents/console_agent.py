"""Test agent for the web console: prints a line, makes one LLM call (the daemon's
script) and one tool call (`echo`), then asks "Ship it?" and exits with the answer.

Output: {"answer": "<the text>", "reply": "<the model's reply>"}.
"""

from __future__ import annotations

import keel

print("console agent starting", flush=True)
with keel.connect() as k:
    reply = k.llm_chat([{"role": "user", "content": "plan the release"}], max_tokens=20)
    k.tool("echo", message="checked", n=2)
    answer = k.ask("Ship it?")
    k.exit({"answer": answer, "reply": reply["message"]["content"]})
