"""Test agent that misbehaves on purpose, to check the kernel's side of the wire contract.

A raw-socket client (no SDK) for protocol 1. Each probe sends something wrong and
checks the kernel's answer (code, `data.kind`, and id where the contract fixes it):

  connection 1  a garbage line before hello  -> -32700 parse_error, id null; then a good
                hello either works or finds the connection closed (both acceptable)
  connection 2  sys.now before hello         -> 1000 unauthenticated
  connection 3  hello with a forged token    -> 1000 unauthenticated
  connection 4  good hello, then:
                  unknown method             -> -32601 unknown_method
                  llm.chat without messages  -> -32602 invalid_params
                  tool.call of unknown tool  -> 1002 not_found
                  {"hello":"world"}          -> -32600 invalid_request
                  sys.now                    -> a result (errors leave the connection usable)
                  a 2 MiB line               -> -32600 too_large, then the connection closes
  connection 5  hello, run.emit, run.exit, then sys.now -> 1003 run_exited

Prints one JSON object on stdout, {"ok": bool, "probes": {...}, "mismatches": [...]},
and exits 0 when every answer matched, else 1 with one line per mismatch on stderr.
Uses `KEEL_SOCKET` and `KEEL_RUN_TOKEN`; every read gives up after 10 s.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any

READ_TIMEOUT_S = 10
BIG_LINE_BYTES = 2 * 1024 * 1024

# What `Connection.read` returns instead of a response (as fresh copies).
CLOSED = {"closed": True}
TIMED_OUT = {"timeout": True}


class Connection:
    """A raw connection that sends bytes and reads one JSON line at a time."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(READ_TIMEOUT_S)
        self.sock.connect(path)
        self.buffer = b""

    def send_raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass  # the kernel hung up; the next read says so

    def send(self, message: Any) -> None:
        self.send_raw(json.dumps(message).encode() + b"\n")

    def request(self, request_id: int, method: str, params: Any) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return self.read()

    def read(self) -> dict[str, Any]:
        """The next response, summarised; or CLOSED / TIMED_OUT."""
        while True:
            while b"\n" not in self.buffer:
                try:
                    chunk = self.sock.recv(65536)
                except socket.timeout:
                    return dict(TIMED_OUT)
                except OSError:  # e.g. ECONNRESET: the kernel closed with our data unread
                    return dict(CLOSED)
                if not chunk:
                    return dict(CLOSED)
                self.buffer += chunk
            line, _, self.buffer = self.buffer.partition(b"\n")
            try:
                message = json.loads(line)
            except ValueError:
                return {"unparsable": line[:200].decode(errors="replace")}
            if isinstance(message, dict) and "method" in message and "id" not in message:
                continue  # a notification from the kernel; not what we are waiting for
            return summarise(message)

    def close(self) -> None:
        self.sock.close()


def summarise(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        return {"not_an_object": message}
    summary: dict[str, Any] = {"id": message.get("id")}
    error = message.get("error")
    if isinstance(error, dict):
        data = error.get("data")
        summary["code"] = error.get("code")
        summary["kind"] = data.get("kind") if isinstance(data, dict) else None
        summary["message"] = error.get("message")
    elif "result" in message:
        summary["result"] = message["result"]
    return summary


class Probes:
    def __init__(self, path: str, token: str) -> None:
        self.path = path
        self.token = token
        self.observed: dict[str, Any] = {}
        self.mismatches: list[str] = []

    def check(self, name: str, got: dict[str, Any], **expected: Any) -> None:
        self.observed[name] = got
        for key, want in expected.items():
            if got.get(key) != want:
                self.mismatches.append(f"{name}: expected {key}={want!r}, got {got!r}")
                return

    def hello(self, conn: Connection, name: str) -> bool:
        got = conn.request(0, "hello", {"token": self.token})
        self.observed[name] = got
        result = got.get("result")
        if not isinstance(result, dict) or result.get("protocol") != 1 or "run_id" not in result:
            self.mismatches.append(f"{name}: expected a hello result with protocol 1, got {got!r}")
            return False
        run_id = os.environ.get("KEEL_RUN_ID")
        if run_id and result["run_id"] != run_id:
            self.mismatches.append(f"{name}: run_id {result['run_id']!r} != KEEL_RUN_ID {run_id!r}")
        return True

    def garbage_before_hello(self) -> None:
        conn = Connection(self.path)
        conn.send_raw(b"this is not json\n")
        got = conn.read()
        self.check("garbage_before_hello", got, code=-32700, kind="parse_error", id=None)
        after = conn.request(0, "hello", {"token": self.token})
        if "result" in after:
            got["after"] = "usable"
        elif after == CLOSED:
            got["after"] = "closed"
        else:
            got["after"] = after
            self.mismatches.append(
                f"garbage_before_hello: expected the connection usable or closed, got {after!r}"
            )
        conn.close()

    def request_before_hello(self) -> None:
        conn = Connection(self.path)
        got = conn.request(1, "sys.now", {})
        self.check("request_before_hello", got, code=1000, kind="unauthenticated", id=1)
        conn.close()

    def forged_token(self) -> None:
        conn = Connection(self.path)
        got = conn.request(0, "hello", {"token": "forged-" + self.token[::-1]})
        self.check("forged_token", got, code=1000, kind="unauthenticated", id=0)
        conn.close()

    def errors_after_hello(self) -> None:
        conn = Connection(self.path)
        if not self.hello(conn, "hello"):
            conn.close()
            return
        self.check(
            "unknown_method",
            conn.request(1, "no.such.method", {}),
            code=-32601,
            kind="unknown_method",
            id=1,
        )
        self.check(
            "llm_chat_without_messages",
            conn.request(2, "llm.chat", {"max_tokens": 16}),
            code=-32602,
            kind="invalid_params",
            id=2,
        )
        self.check(
            "unknown_tool",
            conn.request(3, "tool.call", {"name": "no.such.tool", "args": {}}),
            code=1002,
            kind="not_found",
            id=3,
        )
        conn.send({"hello": "world"})
        self.check("not_a_request", conn.read(), code=-32600, kind="invalid_request")
        still_usable = conn.request(4, "sys.now", {})
        self.observed["still_usable"] = still_usable
        if not isinstance(still_usable.get("result"), dict):
            self.mismatches.append(f"still_usable: expected a sys.now result, got {still_usable!r}")
        self.too_large(conn)
        conn.close()

    def too_large(self, conn: Connection) -> None:
        filler = "x" * BIG_LINE_BYTES
        line = json.dumps(
            {"jsonrpc": "2.0", "id": 5, "method": "run.emit", "params": {"event": filler}}
        ).encode() + b"\n"
        # Send from another thread: the kernel may stop reading half-way, and this thread
        # must be free to read its answer.
        sender = threading.Thread(target=conn.send_raw, args=(line,), daemon=True)
        sender.start()
        got = conn.read()
        self.check("too_large", got, code=-32600, kind="too_large")
        after = conn.read()
        got["after"] = "closed" if after == CLOSED else after
        if after != CLOSED:
            self.mismatches.append(f"too_large: expected the connection closed, got {after!r}")
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)  # unblocks the sender if it is still stuck
        except OSError:
            pass
        sender.join(timeout=READ_TIMEOUT_S)

    def calls_after_exit(self) -> None:
        conn = Connection(self.path)
        if not self.hello(conn, "hello_again"):
            conn.close()
            return
        probe = {"probe": "bad_client"}
        self.check("emit", conn.request(1, "run.emit", {"event": probe}), result={})
        self.check("exit", conn.request(2, "run.exit", {"output": probe}), result={})
        self.check(
            "call_after_exit", conn.request(3, "sys.now", {}), code=1003, kind="run_exited", id=3
        )
        conn.close()


def main() -> int:
    path = os.environ.get("KEEL_SOCKET")
    token = os.environ.get("KEEL_RUN_TOKEN")
    if not path or not token:
        print("bad_client: KEEL_SOCKET and KEEL_RUN_TOKEN must be set", file=sys.stderr)
        return 1
    probes = Probes(path, token)
    for probe in (
        probes.garbage_before_hello,
        probes.request_before_hello,
        probes.forged_token,
        probes.errors_after_hello,
        probes.calls_after_exit,  # last: it ends the run
    ):
        try:
            probe()
        except OSError as err:
            probes.mismatches.append(f"{probe.__name__}: {err!r}")
    ok = not probes.mismatches
    summary = {"ok": ok, "probes": probes.observed, "mismatches": probes.mismatches}
    print(json.dumps(summary), flush=True)
    for mismatch in probes.mismatches:
        print(f"bad_client: mismatch: {mismatch}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
