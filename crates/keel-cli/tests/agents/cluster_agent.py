"""Test agent for many kernel nodes: STEPS model calls in a row (default 6), each asking
"run <id> step N", with CLUSTER_AGENT_DELAY_MS (default 0) of sleep after each, so a test
can kill or pause a node between two calls. Run against the mock upstream with an echo
script: every prompt is distinct, so its counts show whether any call was sent twice.

Exits with {"replies": [...]} (and prints it as one JSON line on stdout).
"""

from __future__ import annotations

import json
import os
import sys
import time

import keel


def main() -> int:
    steps = int(os.environ.get("STEPS", "6"))
    delay_s = int(os.environ.get("CLUSTER_AGENT_DELAY_MS", "0")) / 1000
    with keel.connect() as k:
        replies = []
        for step in range(1, steps + 1):
            reply = k.llm_chat([{"role": "user", "content": f"run {k.run_id} step {step}"}])
            replies.append(reply["message"]["content"])
            print(f"cluster_agent: step {step}/{steps}", file=sys.stderr, flush=True)
            if delay_s:
                time.sleep(delay_s)  # not a syscall: only widens the window for a kill
        output = {"replies": replies}
        k.exit(output)
    print(json.dumps(output), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
