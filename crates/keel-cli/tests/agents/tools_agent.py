"""Test agent for governed tools: performs the calls of its input in order and exits
with what each returned.

Input (``keel run --input``): {"calls": [{"tool": NAME, "args": {...}} |
{"exec": CODE, "lang": "python", "inputs": {...}, "limits": {...}} | {"list": true} |
{"read_file": PATH} (the agent's own view of a file)]}.
Output: {"results": [{"ok": RESULT} | {"error": KIND, "message": TEXT, "data": {...}}]}.
"""

from __future__ import annotations

import keel

plan = keel.input({"calls": []})
results = []
with keel.connect() as k:
    for call in plan["calls"]:
        try:
            if "tool" in call:
                results.append({"ok": k.tool(call["tool"], call.get("args", {}))})
            elif "exec" in call:
                out = k.exec(
                    call["exec"],
                    lang=call.get("lang", "python"),
                    inputs=call.get("inputs"),
                    limits=call.get("limits"),
                )
                results.append({"ok": out})
            elif "read_file" in call:
                with open(call["read_file"]) as f:
                    results.append({"ok": f.read()})
            elif call.get("list"):
                results.append({"ok": sorted(t["name"] for t in k.list_tools())})
        except keel.KeelError as err:
            results.append({"error": err.kind, "message": err.message, "data": err.data})
    k.exit({"results": results})
