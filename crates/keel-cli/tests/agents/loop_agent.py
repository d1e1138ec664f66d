"""Sends the very same LLM request three times in a row: the loop detector's case."""

import keel

k = keel.connect()
for _ in range(3):
    k.llm_chat([{"role": "user", "content": "are we there yet?"}])
k.exit({"asked": 3})
