"""Test agent for process trees. Input: {"spawn": [{"command": [...], "input": ...}],
"wait": true, "sleep_ms": N, "recv": true}. Spawns the children (checkpointing their
ids), optionally receives one message, sleeps, waits for each child, and exits with
what it saw."""

import keel

plan = keel.input({})
with keel.connect() as k:
    state = k.restore() or {}
    children = state.get("children")
    if children is None:
        children = [k.spawn(c["command"], input=c.get("input")) for c in plan.get("spawn", [])]
        k.checkpoint({"children": children})
    out = {"children": children}
    if plan.get("recv"):
        out["message"] = k.recv()["message"]
    if plan.get("sleep_ms"):
        before = k.now_ms()
        k.sleep(plan["sleep_ms"])
        out["slept_ms"] = k.now_ms() - before
    if plan.get("wait"):
        out["waited"] = [k.wait(child) for child in children]
    k.exit(out)
