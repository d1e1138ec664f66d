"""Keel's Python SDK: talk to the Keel agent kernel from an agent program.

Keel starts your program with ``KEEL_SOCKET`` and ``KEEL_RUN_TOKEN`` set; `connect()`
uses them. Every interaction with the world (LLM calls, tools, time, randomness, asking
a human) is a *syscall* that the kernel meters and journals::

    import keel

    with keel.connect() as k:
        state = k.restore() or {"done": 0}       # resume after a crash
        for step in range(state["done"], 3):
            reply = k.llm_chat([{"role": "user", "content": f"step {step + 1}"}])
            k.tool("kv.put", key=f"step-{step + 1}", value=reply["message"]["content"])
            state["done"] = step + 1
            k.checkpoint(state)                  # replay after a crash starts here
        k.exit({"steps": state["done"]})

Run it with ``keel run -- python3 agent.py``.

Durability, and the one rule it asks of you: if the kernel crashes, it starts your
program again from the top and answers its syscalls from the journal (the LLM is not
called, nor paid, twice) until the program asks for something new. So a program must do
the same thing given the same syscall results:

- take time and randomness from `Client.now_ms()` and `Client.random()`, not from
  `time` or `random`;
- call `Client.restore()` first and skip the work the returned state says is done;
- `Client.checkpoint()` after each unit of work, which bounds what is replayed.

Errors: a syscall the kernel refuses raises `KeelError` (match on ``err.kind``, e.g.
``"budget_exhausted"``); a lost connection raises `ConnectionLost`, after which the
program should simply exit.
"""

from keel._client import (
    ERROR_KINDS,
    MAX_EXEC_LINE_BYTES,
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Client,
    ConnectionLost,
    KeelError,
    NotUnderKeel,
    ProtocolError,
    connect,
    input,
)

__version__ = "0.1.0"

__all__ = [
    "ERROR_KINDS",
    "MAX_EXEC_LINE_BYTES",
    "MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "Client",
    "ConnectionLost",
    "KeelError",
    "NotUnderKeel",
    "ProtocolError",
    "connect",
    "input",
]
