"""Stand-ins for the Keel kernel, for testing the SDK and the Python agents hermetically.

`FakeKernel` is a bare Unix socket server: each connection is handed to a test's own
handler, which reads and writes JSON lines as it likes (to answer out of order, drop the
connection, send errors...).

`ScriptedKernel` plays the kernel's side of protocol 1 closely enough to run real agent
programs: hello, the scripted LLM, the built-in tools, checkpoints, human answers, and
above all the journal. It can "crash" after any journal entry (the agent is killed) and
then start the agent again, answering its syscalls from the journal after the last
checkpoint, as the kernel does on recovery. That is what lets the tests prove an agent
is deterministic and resumes without repeating an LLM call.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SDK_DIR = Path(__file__).resolve().parents[1]
MAX_LINE_BYTES = 1024 * 1024


class LineTooLong(Exception):
    """A peer sent a line longer than the limit."""


class LineConnection:
    """One accepted connection, read and written as JSON lines."""

    def __init__(self, sock: socket.socket, max_line: int | None = None) -> None:
        self.sock = sock
        self.max_line = max_line
        self._buffer = b""
        self._send_lock = threading.Lock()

    def read_line(self) -> bytes | None:
        """The next line without its newline, or None at end of stream."""
        while b"\n" not in self._buffer:
            if self.max_line is not None and len(self._buffer) > self.max_line:
                raise LineTooLong()
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        if self.max_line is not None and len(line) > self.max_line:
            raise LineTooLong()
        return line

    def read(self) -> Any:
        """The next line parsed as JSON, or None at end of stream."""
        line = self.read_line()
        return None if line is None else json.loads(line)

    def send(self, message: Any) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass  # the peer is gone; its reader will notice

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class FakeKernel:
    """A Unix socket server in a temporary directory; `handler` serves each connection."""

    def __init__(self, handler: Callable[[LineConnection], None], max_line: int | None = None):
        self.handler = handler
        self.max_line = max_line
        self._dir = tempfile.TemporaryDirectory(prefix="keel-fake-")
        self.path = os.path.join(self._dir.name, "keel.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(16)
        self.connections: list[LineConnection] = []
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def env(self, token: str = "secret-token", run_id: str = "run_test") -> dict[str, str]:
        return {"KEEL_SOCKET": self.path, "KEEL_RUN_TOKEN": token, "KEEL_RUN_ID": run_id}

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            conn = LineConnection(sock, self.max_line)
            self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: LineConnection) -> None:
        try:
            self.handler(conn)
        finally:
            conn.close()

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for conn in self.connections:
            conn.close()
        self._dir.cleanup()

    def __enter__(self) -> FakeKernel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- the scripted kernel ------------------------------------------------------------------


def error(code: int, kind: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "data": {"kind": kind}}


class SyscallError(Exception):
    def __init__(self, code: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.body = error(code, kind, message)


@dataclass
class Entry:
    """One journaled syscall: its matching key and its outcome."""

    method: str
    params_key: str  # canonical JSON of the params
    result: Any = None
    error: dict[str, Any] | None = None


@dataclass
class AgentRun:
    """What one start of the agent process did."""

    returncode: int
    stdout: str
    stderr: str
    crashed: bool
    replayed: int  # syscalls answered from the journal


@dataclass
class _Incarnation:
    token: str
    replay_pool: list[Entry]
    occurrences: dict[tuple[str, str], int] = field(default_factory=dict)
    replayed: list[Entry] = field(default_factory=list)
    crashed: bool = False
    process: subprocess.Popen[str] | None = None


def _contains(entries: list[Entry], entry: Entry) -> bool:
    return any(e is entry for e in entries)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


NO_OUTPUT = object()


class ScriptedKernel:
    """The kernel's side of protocol 1, in memory, with a journal that survives "crashes".

    `run_agent()` starts the agent program once; if `crash_after` journal entries are
    reached, the agent is killed the moment that entry is durable (before its answer is
    sent), like a kernel dying mid-run. Calling `run_agent()` again is the recovery.
    """

    def __init__(
        self,
        script: dict[str, Any] | None = None,
        answers: Sequence[str] = (),
        crash_after: int | None = None,
        llm_delay_s: float = 0.0,
    ) -> None:
        responses = (script or {}).get("responses", [])
        self.match_entries = [r for r in responses if "match" in r]
        self.ordered_entries = [r for r in responses if "match" not in r]
        self.answers = list(answers)
        self.crash_after = crash_after
        self.llm_delay_s = llm_delay_s
        self.journal: list[Entry] = []
        self.abandoned: list[Entry] = []
        self.kv: dict[str, Any] = {}
        # Memory: threads by id, records by (namespace, key) -> (value, text).
        self.threads: dict[str, list[dict[str, Any]]] = {}
        self.memory: dict[tuple[str, str], tuple[Any, str]] = {}
        # IPC: this run's mailbox (messages as `ipc.recv` answers them, oldest first) and
        # what it sent, as (to, message, correlation_id).
        self.mailbox: list[dict[str, Any]] = []
        self.sent: list[tuple[str, Any, str | None]] = []
        self.llm_requests: list[list[dict[str, Any]]] = []  # live calls only: what was paid
        self.output: Any = NO_OUTPUT
        self.events: list[Any] = []
        self._lock = threading.Lock()
        self._incarnation: _Incarnation | None = None

    # -- running the agent ---------------------------------------------------------------

    def run_agent(
        self, argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60
    ) -> AgentRun:
        with self._lock:
            last_checkpoint = max(
                (i for i, e in enumerate(self.journal) if e.method == "state.checkpoint"),
                default=-1,
            )
            incarnation = _Incarnation(
                token=secrets.token_hex(8), replay_pool=self.journal[last_checkpoint + 1 :]
            )
            self._incarnation = incarnation
        with FakeKernel(self._serve, max_line=MAX_LINE_BYTES) as server:
            child_env = dict(os.environ)
            child_env.update(env or {})
            child_env.update(server.env(token=incarnation.token, run_id="run_scripted"))
            child_env["PYTHONPATH"] = str(SDK_DIR)
            process = subprocess.Popen(
                [sys.executable, *argv],
                env=child_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            incarnation.process = process
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
                raise AssertionError(f"agent timed out; stderr:\n{stderr}") from None
        self._finish(incarnation)
        return AgentRun(
            process.returncode, stdout, stderr, incarnation.crashed, len(incarnation.replayed)
        )

    def _finish(self, incarnation: _Incarnation) -> None:
        """After a clean end, journal entries that replay never reached are abandoned (kept
        for audit, never replayed). After a crash they stay: the next start may need them."""
        if incarnation.crashed:
            return
        with self._lock:
            tail = [e for e in incarnation.replay_pool if not _contains(incarnation.replayed, e)]
            self.abandoned.extend(tail)
            self.journal = [e for e in self.journal if not _contains(tail, e)]

    def _crash(self, incarnation: _Incarnation) -> None:
        incarnation.crashed = True
        if incarnation.process is not None:
            incarnation.process.send_signal(signal.SIGKILL)

    # -- serving a connection ------------------------------------------------------------

    def _serve(self, conn: LineConnection) -> None:
        incarnation = self._incarnation
        assert incarnation is not None
        authenticated = False
        while True:
            try:
                line = conn.read_line()
            except LineTooLong:
                conn.send(
                    {
                        "jsonrpc": "2.0",
                        "id": None,
                        "error": error(-32600, "too_large", "line longer than 1 MiB"),
                    }
                )
                return
            if line is None or incarnation.crashed:
                return
            try:
                request = json.loads(line)
            except ValueError:
                parse_error = error(-32700, "parse_error", "not JSON")
                conn.send({"jsonrpc": "2.0", "id": None, "error": parse_error})
                continue
            if (
                not isinstance(request, dict)
                or request.get("jsonrpc") != "2.0"
                or not isinstance(request.get("method"), str)
            ):
                request_id = request.get("id") if isinstance(request, dict) else None
                conn.send(
                    {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "error": error(-32600, "invalid_request", "not a JSON-RPC 2.0 request"),
                    }
                )
                continue
            request_id = request.get("id")
            method = request["method"]
            params = request.get("params") or {}
            if not authenticated:
                if method == "hello" and params.get("token") == incarnation.token:
                    authenticated = True
                    hello = {"run_id": "run_scripted", "protocol": 1}
                    conn.send({"jsonrpc": "2.0", "id": request_id, "result": hello})
                else:
                    refused = error(1000, "unauthenticated", "say hello with the run token first")
                    conn.send({"jsonrpc": "2.0", "id": request_id, "error": refused})
                continue
            # Each syscall is answered on its own thread, so answers may come out of order.
            threading.Thread(
                target=self._answer,
                args=(conn, incarnation, request_id, method, params),
                daemon=True,
            ).start()

    def _answer(
        self,
        conn: LineConnection,
        incarnation: _Incarnation,
        request_id: Any,
        method: str,
        params: dict[str, Any],
    ) -> None:
        if method == "llm.chat" and self.llm_delay_s:
            time.sleep(self.llm_delay_s)
        with self._lock:
            entry = self._syscall(incarnation, method, params)
            if entry is None:
                return  # crashed: the answer is never sent
        if entry.error is not None:
            conn.send({"jsonrpc": "2.0", "id": request_id, "error": entry.error})
        else:
            conn.send({"jsonrpc": "2.0", "id": request_id, "result": entry.result})

    def _syscall(
        self, incarnation: _Incarnation, method: str, params: dict[str, Any]
    ) -> Entry | None:
        """Answer from the journal if this call is there, else perform and journal it.

        The match is (method, canonical params, occurrence), as in the kernel. The caller
        holds the lock."""
        if incarnation.crashed:
            return None
        if method == "state.restore":
            return Entry(method, "", result={"state": self._last_checkpoint_state()})
        key = (method, canonical(params))
        occurrence = incarnation.occurrences.get(key, 0)
        incarnation.occurrences[key] = occurrence + 1
        matches = [e for e in incarnation.replay_pool if (e.method, e.params_key) == key]
        if occurrence < len(matches):
            incarnation.replayed.append(matches[occurrence])
            return matches[occurrence]
        # A new request: perform it live. Journaled calls keep matching after it: with
        # several threads, a new call can overtake an old one still on its way, and
        # serving that one live would pay for it twice (see `_finish`).
        entry = Entry(method, key[1])
        try:
            entry.result = self._perform(method, params)
        except SyscallError as err:
            entry.error = err.body
        self.journal.append(entry)
        if self.crash_after is not None and len(self.journal) >= self.crash_after:
            self.crash_after = None
            self._crash(incarnation)
            return None
        return entry

    def _last_checkpoint_state(self) -> Any:
        for entry in reversed(self.journal):
            if entry.method == "state.checkpoint" and entry.error is None:
                return json.loads(entry.params_key)["state"]
        return None

    # -- the syscalls themselves ---------------------------------------------------------

    def _perform(self, method: str, params: dict[str, Any]) -> Any:
        if self.output is not NO_OUTPUT:
            raise SyscallError(1003, "run_exited", "the run has exited")
        if method == "llm.chat":
            return self._llm_chat(params)
        if method == "tool.call":
            return {"result": self._tool(params.get("name"), params.get("args") or {})}
        if method == "tool.list":
            return {
                "tools": [
                    {"name": n, "description": n, "input_schema": {"type": "object"}}
                    for n in ("echo", "kv.get", "kv.put")
                ]
            }
        if method == "state.checkpoint":
            return {"seq": len(self.journal) + 1}
        if method == "sys.now":
            return {"unix_ms": int(time.time() * 1000)}
        if method == "sys.random":
            return {"value": secrets.randbits(64)}
        if method == "human.ask":
            if not self.answers:
                raise SyscallError(1009, "cancelled", "no answer scripted for this test")
            return {"answer": self.answers.pop(0)}
        if method == "run.emit":
            self.events.append(params.get("event"))
            return {}
        if method == "run.exit":
            self.output = params.get("output")
            return {}
        if method.startswith("mem."):
            return self._memory(method, params)
        if method == "ipc.send":
            self.sent.append((params["to"], params["message"], params.get("correlation_id")))
            return {"seq": len(self.sent)}
        if method == "ipc.recv":
            # Never blocks (the kernel's lock is held): an empty mailbox is a timeout.
            return {"message": self.mailbox.pop(0) if self.mailbox else None}
        raise SyscallError(-32601, "unknown_method", f"no method {method!r}")

    def _memory(self, method: str, params: dict[str, Any]) -> Any:
        """Memory as the kernel serves it, simplified: search matches any word."""
        if method == "mem.thread.append":
            message = params["message"]
            thread = self.threads.setdefault(params["thread"], [])
            thread.append({"index": len(thread), **message})
            return {"index": len(thread) - 1}
        if method == "mem.thread.read":
            messages = list(self.threads.get(params["thread"], []))
            if "last" in params:
                messages = messages[len(messages) - min(params["last"], len(messages)) :]
            if "max_tokens" in params:
                kept: list[dict[str, Any]] = []
                used = 0
                for message in reversed(messages):
                    cost = -(-len(message["content"].encode()) // 4) + 4
                    if used + cost > params["max_tokens"]:
                        break
                    used += cost
                    kept.insert(0, message)
                messages = kept
            return {"messages": messages}
        key = (params["namespace"], params.get("key", ""))
        if method == "mem.put":
            value = params["value"]
            text = params.get("text", value if isinstance(value, str) else json.dumps(value))
            self.memory[key] = (value, text)
            return {}
        if method == "mem.get":
            return {"value": self.memory.get(key, (None, ""))[0]}
        if method == "mem.delete":
            return {"deleted": self.memory.pop(key, None) is not None}
        if method == "mem.search":
            words = {w for w in re.split(r"\W+", params["query"].lower()) if w}
            hits = []
            for (namespace, k), (_, text) in sorted(self.memory.items()):
                score = sum(1 for w in re.split(r"\W+", text.lower()) if w in words)
                if namespace == params["namespace"] and score:
                    hits.append({"key": k, "score": float(score), "snippet": text[:64]})
            hits.sort(key=lambda h: -h["score"])
            return {"hits": hits[: params.get("limit", 10)]}
        raise SyscallError(-32601, "unknown_method", f"no method {method!r}")

    def _llm_chat(self, params: dict[str, Any]) -> dict[str, Any]:
        messages = params.get("messages")
        if not isinstance(messages, list):
            raise SyscallError(-32602, "invalid_params", "llm.chat needs `messages`")
        last_user = next(
            (m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), ""
        )
        reply = next((r for r in self.match_entries if r["match"] in last_user), None)
        if reply is None:
            if not self.ordered_entries:
                raise SyscallError(1004, "provider_error", f"no scripted reply for {last_user!r}")
            reply = self.ordered_entries.pop(0)
        self.llm_requests.append(messages)
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content", "")}
        if "tool_calls" in reply:
            message["tool_calls"] = reply["tool_calls"]
        usage = reply.get("usage") or {
            "input_tokens": sum(len(m.get("content") or "") for m in messages) // 4,
            "output_tokens": len(message["content"]) // 4,
        }
        return {"message": message, "usage": usage, "cost_usd": 0.0, "model": "scripted"}

    def _tool(self, name: Any, args: dict[str, Any]) -> Any:
        if name == "echo":
            return args
        if name == "kv.put":
            self.kv[args["key"]] = args.get("value")
            return True
        if name == "kv.get":
            return self.kv.get(args["key"])
        raise SyscallError(1002, "not_found", f"no tool named {name!r}")
