"""Test agent for `human.ask`: asks "approve?" and exits with the answer.

The run parks in `waiting` until an operator runs `keel answer RUN --text ...`; then it
calls `run.exit` with {"answer": "<the text>"} and prints that object as one JSON line.
"""

from __future__ import annotations

import json

import keel

with keel.connect() as k:
    output = {"answer": k.ask("approve?")}
    k.exit(output)
print(json.dumps(output), flush=True)
