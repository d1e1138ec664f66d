"""An agent served over A2A (tests/it/a2a.rs): its input is the task's message.

"ask" asks a human (the A2A caller: an input-required task) and answers "got: <reply>";
"slow" waits long enough to be canceled; "fail" fails; anything else is echoed.
"""

import sys
import time

import keel

task = keel.input({})
text = task.get("text", "")
with keel.connect() as k:
    if text == "ask":
        answer = k.ask("Which city?")
        k.exit(f"got: {answer}")
    elif text == "slow":
        time.sleep(120)
        k.exit("too late")
    elif text == "fail":
        print("failing on purpose", file=sys.stderr)
        sys.exit(3)
    elif text == "data":
        k.exit({"echo": task.get("data"), "context": task.get("context_id")})
    else:
        k.exit(f"echo: {text}")
