"""Test agent for semantic memory: puts records, then searches one query three ways.

Used by tests/it/memory.rs. The texts are designed for the offline hash embedder (which
compares words and word pieces, not meanings): the query shares no whole word with the
record it should find, only pieces ("kittens"/"kitten", "napping"/"naps"), so full-text
search misses it and semantic search ranks it first.

- Env `SEMANTIC_AGENT_DELAY_MS` (default 0): sleep this long after every put, so a test
  can kill the kernel between two writes.
- Env `SEMANTIC_AGENT_OPENAI` (set to anything): also call the gateway's `/v1/embeddings`
  with the official `openai` package (OPENAI_BASE_URL and OPENAI_API_KEY are the run's).
- Finally `run.exit` with the hits of each mode (keys, best first), also printed.
"""

from __future__ import annotations

import json
import os
import sys
import time

import keel

RECORDS = {
    "cat": "The kitten naps on the windowsill every afternoon",
    "tax": "Quarterly tax filing is due at the end of the month",
    "bike": "Replace the bicycle chain before the spring ride",
    "dog": "The puppy chews the garden hose by the fence",
}
QUERY = "kittens napping near windows"


def main() -> int:
    delay_s = int(os.environ.get("SEMANTIC_AGENT_DELAY_MS", "0")) / 1000
    with keel.connect() as k:
        for key, text in RECORDS.items():
            k.mem_put("facts", key, {"key": key}, text=text)
            print(f"semantic_agent: put {key}", file=sys.stderr, flush=True)
            if delay_s:
                time.sleep(delay_s)  # not a syscall: only widens the window for a kill
        output = {
            mode: [h["key"] for h in k.mem_search("facts", QUERY, limit=3, mode=mode)]
            for mode in ("text", "semantic", "hybrid")
        }
        if os.environ.get("SEMANTIC_AGENT_OPENAI"):
            import openai

            client = openai.OpenAI()
            response = client.embeddings.create(
                model="text-embedding-3-small", input=["through the gateway", "second input"]
            )
            floats = client.embeddings.create(
                model="text-embedding-3-small", input="one string", encoding_format="float"
            )
            output["gateway"] = {
                "count": len(response.data),
                "dims": len(response.data[0].embedding),
                "model": response.model,
                "tokens": response.usage.prompt_tokens,
                "float_dims": len(floats.data[0].embedding),
            }
        k.exit(output)
    print(json.dumps(output), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
