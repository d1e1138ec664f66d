"""Test agent for the console's actions: starts a child run that sleeps (shown under it in
the runs list), waits for a message, then makes two LLM calls; with `--budget-llm-calls 1`
the second parks the run until its budget is topped up.

Output: {"message": the message's body, "child": the child's run id}.
"""

import keel

with keel.connect() as k:
    child = k.spawn(["python3", "-c", "import time; time.sleep(300)"])
    # Pause and resume reach the agent as signals in its mailbox; the operator's message
    # is the first thing that is not one.
    message = k.recv()
    while isinstance(message.get("message"), dict) and "signal" in message["message"]:
        message = k.recv()
    k.llm_chat([{"role": "user", "content": "first"}])
    k.llm_chat([{"role": "user", "content": "second"}])
    k.exit({"message": message["message"], "child": child})
