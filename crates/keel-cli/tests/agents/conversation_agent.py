"""Test agent for journal growth: a long conversation that re-sends its whole history on
every `llm.chat` call, as chat agents do.

- Env `CONVERSATION_TURNS` (default 100): turn N sends the user message "turn N: " plus
  a fixed 300-byte filler, appended to every message so far, and appends the reply.
- Finally `run.exit` with {"turns": N, "messages": 2N, "conversation_bytes": B}, where B
  is the size of the conversation itself: the compact JSON of each of its messages.
"""

from __future__ import annotations

import json
import os
import sys

import keel

FILLER = "The quick brown fox jumps over the lazy dog, again and again. " * 5


def main() -> int:
    turns = int(os.environ.get("CONVERSATION_TURNS", "100"))
    messages: list[dict[str, str]] = []
    with keel.connect() as k:
        for turn in range(turns):
            messages.append({"role": "user", "content": f"turn {turn}: {FILLER}"})
            reply = k.llm_chat(messages)
            messages.append({"role": "assistant", "content": reply["message"]["content"] or ""})
        size = sum(len(json.dumps(m, separators=(",", ":"))) for m in messages)
        output = {"turns": turns, "messages": len(messages), "conversation_bytes": size}
        k.exit(output)
    print(json.dumps(output), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
