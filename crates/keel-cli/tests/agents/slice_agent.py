"""Test agent for budget slices: spawns a child with a slice of 3 tool calls out of its
own 5, tries a second such child while the first runs (it must not fit), lets the first
finish, then spawns the second (now it fits), and exits with what happened."""

import os
import sys

import keel

CHILD = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "proc_agent.py")
out = {}
with keel.connect() as k:
    first = k.spawn(["python3", CHILD], input={"recv": True}, budget={"tool_calls": 3})
    try:
        k.spawn(["python3", CHILD], input={}, budget={"tool_calls": 3})
        out["second_while_first_runs"] = "spawned"
    except keel.KeelError as err:
        out["second_while_first_runs"] = err.kind
    k.send(first, "done")
    out["first"] = k.wait(first)["state"]
    second = k.spawn(["python3", CHILD], input={}, budget={"tool_calls": 3})
    out["second_after"] = k.wait(second)["state"]
    k.exit(out)
