"""A worker of the team example: receives one task by message, asks the LLM about it,
and sends the answer back to whoever sent the task."""

import keel

me = keel.input({}).get("name", "worker")
with keel.connect() as k:
    message = k.recv()
    task = message["message"]["task"]
    reply = k.llm_chat([{"role": "user", "content": f"[work] {task}"}])
    answer = reply["message"]["content"]
    k.send(message["from"], {"result": f"{me}: {answer}"}, correlation_id=message.get("correlation_id"))
    k.exit({"task": task, "answer": answer})
