"""Test agent for event triggers (tests/it/events.rs). The tests copy it under several
names (a.py, b.py) so that runs of it have different agent names. Its behaviour is its
environment:

- `EVENT_LOG`: a file it appends one line to first, "RUN_ID INPUT" (its `KEEL_INPUT`).
- `EVENT_MODE=ok` (the default): exits with {"from": <its file name>, "value": EVENT_VALUE}.
- `EVENT_MODE=fail`: prints "event_agent: failing" on stderr and exits with status 3
  without `run.exit`.
- `EVENT_MODE=publish`: publishes {"hello": EVENT_VALUE} on `EVENT_TOPIC`, then exits with
  {"delivered": <subscribers reached>}.
"""

from __future__ import annotations

import os
import sys

import keel

log = os.environ.get("EVENT_LOG")
if log:
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"{os.environ.get('KEEL_RUN_ID', '')} {os.environ.get('KEEL_INPUT', 'null')}\n")

mode = os.environ.get("EVENT_MODE", "ok")
value = os.environ.get("EVENT_VALUE", "")
with keel.connect() as k:
    if mode == "fail":
        print("event_agent: failing", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "publish":
        delivered = k.publish(os.environ.get("EVENT_TOPIC", "news"), {"hello": value})
        k.exit({"delivered": delivered})
    k.exit({"from": os.path.basename(__file__), "value": value})
