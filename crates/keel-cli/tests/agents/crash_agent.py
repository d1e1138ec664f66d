"""Test agent for crash recovery: twelve LLM calls in a row, with a checkpoint after the fifth.

Used by the end-to-end tests that kill the kernel mid-run and check that the restarted
run finishes with the same output and without calling the LLM again for journaled steps.
Run with `--llm-script crash_script.json` (twelve ordered replies, "reply 1".."reply 12").

- Restores first: a fresh run calls `sys.now` and `sys.random` once each; a resumed run
  takes them, the replies so far and the step index from the checkpoint.
- Call N sends the user message "step N of 12" and keeps the reply's content.
- After call 5 it checkpoints {"step": 5, "replies": [...], "now": .., "random": ..}.
- Env `CRASH_AGENT_DELAY_MS` (default 0): sleep this long after every call, so a test
  can kill the kernel between two calls.
- Finally `run.exit` with {"replies": [12 contents], "random": <u64>, "now": <unix ms>}
  and the same object printed as one JSON line on stdout. Progress goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time

import keel

CALLS = 12
CHECKPOINT_AFTER = 5


def log(text: str) -> None:
    print(f"crash_agent: {text}", file=sys.stderr, flush=True)


def main() -> int:
    delay_s = int(os.environ.get("CRASH_AGENT_DELAY_MS", "0")) / 1000
    with keel.connect() as k:
        state = k.restore()
        if state is None:
            state = {"step": 0, "replies": [], "now": k.now_ms(), "random": k.random()}
            log(f"fresh start: now={state['now']} random={state['random']}")
        else:
            log(f"resumed from checkpoint at step {state['step']}")

        for step in range(state["step"] + 1, CALLS + 1):
            reply = k.llm_chat([{"role": "user", "content": f"step {step} of {CALLS}"}])
            state["replies"].append(reply["message"]["content"])
            state["step"] = step
            log(f"step {step}/{CALLS} -> {reply['message']['content']!r}")
            if step == CHECKPOINT_AFTER:
                log(f"checkpoint seq {k.checkpoint(state)}")
            if delay_s:
                time.sleep(delay_s)  # not a syscall: only widens the window for a kill

        output = {"replies": state["replies"], "random": state["random"], "now": state["now"]}
        k.exit(output)
    print(json.dumps(output), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
