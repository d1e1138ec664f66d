"""Test agent for the spans of waits, code.exec and embeddings: an embedding, a program
whose tool call nests under its code.exec, a tool call parked for approval, a wait for a
message, and a second LLM call that parks on a one-call budget.

Output: {"vectors": N, "exec": the program's result, "message": what ipc.recv got}.
"""

import keel

with keel.connect() as k:
    out = {"vectors": len(k.call("llm.embed", {"input": ["hello traces"]})["embeddings"])}
    out["exec"] = k.exec('echo(text="from the program")')["result"]
    k.tool("kv.put", {"key": "k", "value": 1})  # requires approval (keel.toml)
    out["message"] = k.recv()
    k.llm_chat([{"role": "user", "content": "make a plan"}], model="scripted-model")
    k.llm_chat([{"role": "user", "content": "wrap up"}], model="scripted-model")  # parks: budget
    k.exit(out)
