"""Test agent for process trees. Input: {"spawn": [{"command": [...], "input": ...}],
"wait": true, "sleep_ms": N, "recv": true, "register": NAME, "send_to": [NAME, MESSAGE],
"signal_children": SIGNAL}. Spawns the children (checkpointing their
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
    if plan.get("register"):
        try:
            k.register(plan["register"])
            out["registered"] = True
        except keel.KeelError as err:
            out["registered"] = err.kind
    if plan.get("send_to"):
        to, message = plan["send_to"]
        k.send(to, message)
    if plan.get("signal_children"):
        out["signalled"] = [k.signal(child, plan["signal_children"]) for child in children]
    if plan.get("recv"):
        received = k.recv()
        out["message"] = received["message"]
        out["received"] = received
    if plan.get("sleep_ms"):
        before = k.now_ms()
        k.sleep(plan["sleep_ms"])
        out["slept_ms"] = k.now_ms() - before
    if plan.get("wait"):
        out["waited"] = [k.wait(child) for child in children]
    k.exit(out)
