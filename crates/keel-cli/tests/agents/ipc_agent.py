"""Test agent for IPC: mailboxes and the request/reply convention over ipc.send/ipc.recv.

Used by the end-to-end IPC tests (tests/it/ipc.rs), including the one that kills the
kernel mid-exchange and checks every message is delivered exactly once, and by the SDK's
tests with the scripted kernel.

- `IPC_ROLE=server`: receive messages (`ipc.recv`, `IPC_RECV_TIMEOUT_MS`, default 1000,
  waiting again on a timeout); answer each request that has a correlation id by sending
  {"echo": <message>} to its sender with the same correlation id; stop at the message
  "stop". Exits with {"received": [<message>, ...]} in the order received.
- `IPC_ROLE=client`: for N in 0..`IPC_COUNT` (default 5), send {"n": N} to run
  `IPC_PEER` with correlation id "req-N", then receive until the reply with that
  correlation id arrives; finally send "stop" to the peer. Exits with
  {"replies": [<reply message>, ...]}.
- `IPC_ROLE=sender`: send `IPC_COUNT` messages {"n": N} to `IPC_PEER` with
  `wait` = env `IPC_WAIT` ("1" default, "0" for would_block), recording each outcome:
  the seq or the error kind. Exits with {"outcomes": [...]}.
- `IPC_ROLE=drainer`: wait `IPC_START_DELAY_MS` (default 0), then receive until
  `IPC_COUNT` messages arrived: one per `ipc.recv`, or with `IPC_RECV_MAX` up to that
  many per call (`recv_many`), sleeping `IPC_DELAY_MS` after each batch. Exits with
  {"received": [...], "batches": [<messages per call>, ...]}.
- `IPC_ROLE=subscriber`: subscribe to topic `IPC_TOPIC` (default "news"), send "ready"
  to `IPC_PEER`, then receive until "stop". Exits with {"received": [[topic, message],
  ...]}.
- `IPC_ROLE=publisher`: receive `IPC_SUBSCRIBERS` (default 2) messages, then publish
  {"n": N} for N in 0..`IPC_COUNT` and finally "stop" on `IPC_TOPIC`. Exits with
  {"delivered": [<subscribers reached by each publish>, ...]}.
- `IPC_DELAY_MS` (default 0): sleep this long after every message handled, so a test can
  kill the kernel mid-exchange.
- `IPC_COMBINED=1`: the client sends each request and receives in one call
  (`send_recv`), and the server answers a request and receives the next in one call.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import keel


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def recv(k: keel.Client) -> dict[str, Any]:
    timeout = env_int("IPC_RECV_TIMEOUT_MS", 1000)
    while True:
        message = k.recv(timeout_ms=timeout)
        if message is not None:
            return message


def main() -> int:
    role = os.environ.get("IPC_ROLE", "server")
    count = env_int("IPC_COUNT", 5)
    delay_s = env_int("IPC_DELAY_MS", 0) / 1000
    peer = os.environ.get("IPC_PEER", "")
    combined = os.environ.get("IPC_COMBINED") == "1"
    timeout = env_int("IPC_RECV_TIMEOUT_MS", 1000)
    output: dict[str, Any]
    with keel.connect() as k:
        if role == "server":
            received = []
            message = recv(k)
            while True:
                received.append(message["message"])
                print(f"ipc_agent: got {json.dumps(message)}", file=sys.stderr, flush=True)
                if message["message"] == "stop":
                    break
                if message.get("correlation_id") and message.get("from"):
                    answer = ({"echo": message["message"]}, message["correlation_id"])
                    if combined:
                        time.sleep(delay_s)
                        message = k.send_recv(
                            message["from"], answer[0], correlation_id=answer[1], timeout_ms=timeout
                        ) or recv(k)
                        continue
                    k.send(message["from"], answer[0], correlation_id=answer[1])
                time.sleep(delay_s)
                message = recv(k)
            output = {"received": received}
        elif role == "client":
            replies = []
            for n in range(count):
                correlation_id = f"req-{n}"
                if combined:
                    reply = k.send_recv(peer, {"n": n}, correlation_id=correlation_id, timeout_ms=timeout)
                else:
                    k.send(peer, {"n": n}, correlation_id=correlation_id)
                    reply = None
                while reply is None or reply.get("correlation_id") != correlation_id:
                    reply = recv(k)
                replies.append(reply["message"])
                print(f"ipc_agent: reply {n}", file=sys.stderr, flush=True)
                time.sleep(delay_s)
            k.send(peer, "stop")
            output = {"replies": replies}
        elif role == "sender":
            wait = os.environ.get("IPC_WAIT", "1") != "0"
            outcomes: list[Any] = []
            for n in range(count):
                try:
                    outcomes.append(k.send(peer, {"n": n}, wait=wait))
                except keel.KeelError as err:
                    outcomes.append(err.kind)
                print(f"ipc_agent: sent {n}: {outcomes[-1]}", file=sys.stderr, flush=True)
            output = {"outcomes": outcomes}
        elif role == "subscriber":
            topic = os.environ.get("IPC_TOPIC", "news")
            k.subscribe(topic)
            k.send(peer, "ready")
            received = []
            while True:
                message = recv(k)
                received.append([message.get("topic"), message["message"]])
                if message["message"] == "stop":
                    break
            output = {"received": received}
        elif role == "publisher":
            topic = os.environ.get("IPC_TOPIC", "news")
            for _ in range(env_int("IPC_SUBSCRIBERS", 2)):
                recv(k)
            delivered = [k.publish(topic, {"n": n}) for n in range(count)]
            delivered.append(k.publish(topic, "stop"))
            output = {"delivered": delivered}
        elif role == "drainer":
            time.sleep(env_int("IPC_START_DELAY_MS", 0) / 1000)
            recv_max = env_int("IPC_RECV_MAX", 0)
            received = []
            batches = []
            while len(received) < count:
                batch = k.recv_many(recv_max, timeout_ms=1000) if recv_max else [recv(k)]
                if batch:
                    received.extend(m["message"] for m in batch)
                    batches.append(len(batch))
                    print(f"ipc_agent: took {len(batch)}", file=sys.stderr, flush=True)
                    time.sleep(delay_s)
            output = {"received": received, "batches": batches}
        else:
            print(f"ipc_agent: unknown IPC_ROLE {role!r}", file=sys.stderr)
            return 2
        print(json.dumps(output), flush=True)
        k.exit(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
