"""Test agent for the simplest end-to-end run: output streams, one tool call, an exit.

Prints "hello from agent" on stdout and "warn" on stderr, calls the built-in `echo` tool
with {"message": "hello", "n": 1}, and exits via `run.exit` with the tool's result, so
the run's output is {"message": "hello", "n": 1}. Nothing else is printed.
"""

from __future__ import annotations

import sys

import keel

print("hello from agent", flush=True)
print("warn", file=sys.stderr, flush=True)
with keel.connect() as k:
    k.exit(k.tool("echo", message="hello", n=1))
