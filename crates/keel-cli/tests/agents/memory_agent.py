"""Test agent for memory: a conversation thread and long-term records.

Used by the end-to-end memory tests (tests/it/memory.rs), including the one that kills the
kernel mid-run and checks no memory write is lost or duplicated.

- Env `MEMORY_AGENT_TURNS` (default 6): for each turn N, append the user message
  "turn N: note about topicN" to the thread, then `mem.put` notes/turn-N = {"turn": N}
  with the text "note number N about topicN".
- Env `MEMORY_AGENT_THREAD` (default "chat"): the thread id (shared with other runs of
  the tenant).
- Env `MEMORY_AGENT_DELAY_MS` (default 0): sleep this long after every turn, so a test
  can kill the kernel between two writes.
- Then reads: search "topic3", the last 2 messages, the messages that fit in 30 tokens,
  notes/turn-1; deletes notes/turn-0 and reads it back (null).
- Env `MEMORY_AGENT_FINAL_DELAY_MS` (default 0): sleep this long after the reads, before
  exiting, so a test can kill the kernel after them and check the replay answers what
  was read the first time.
- Finally `run.exit` with all of that (see `output` below), also printed as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time

import keel


def main() -> int:
    turns = int(os.environ.get("MEMORY_AGENT_TURNS", "6"))
    thread = os.environ.get("MEMORY_AGENT_THREAD", "chat")
    delay_s = int(os.environ.get("MEMORY_AGENT_DELAY_MS", "0")) / 1000
    with keel.connect() as k:
        indexes = []
        for turn in range(turns):
            indexes.append(k.thread_append(thread, "user", f"turn {turn}: note about topic{turn}"))
            k.mem_put("notes", f"turn-{turn}", {"turn": turn}, text=f"note number {turn} about topic{turn}")
            print(f"memory_agent: turn {turn} stored", file=sys.stderr, flush=True)
            if delay_s:
                time.sleep(delay_s)  # not a syscall: only widens the window for a kill
        output = {
            "indexes": indexes,
            "hits": [h["key"] for h in k.mem_search("notes", "topic3")],
            "last2": [m["content"] for m in k.thread_read(thread, last=2)],
            "fit30": len(k.thread_read(thread, max_tokens=30)),
            "turn1": k.mem_get("notes", "turn-1"),
            "deleted": k.mem_delete("notes", "turn-0"),
            "turn0": k.mem_get("notes", "turn-0"),
        }
        final_delay_s = int(os.environ.get("MEMORY_AGENT_FINAL_DELAY_MS", "0")) / 1000
        if final_delay_s:
            print("memory_agent: reads done", file=sys.stderr, flush=True)
            time.sleep(final_delay_s)
        k.exit(output)
    print(json.dumps(output), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
