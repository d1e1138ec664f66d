"""The syscall channel: a thread-safe JSON-RPC 2.0 client over Keel's Unix socket.

One JSON object per line in both directions. Requests may be pipelined and the kernel
may answer them out of order, so responses are matched to callers by id. There is no
background thread: a waiting caller becomes the reader (the "leader") and hands other
callers' responses to them; when its own arrives it passes the role on. A lone caller thus
reads its own reply with no thread switch, which keeps a syscall near the socket's floor.
Everything here follows the wire contract, protocol 1.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import threading
import time
from collections.abc import Mapping, Sequence

# Names only annotations use (strings here, never evaluated): importing `typing` would add
# a few milliseconds to every agent's start. Type checkers take `TYPE_CHECKING` as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any

PROTOCOL_VERSION = 1

#: The kernel refuses longer lines (and then closes the connection), so the client
#: refuses to send them and keeps the connection usable instead.
MAX_LINE_BYTES = 1024 * 1024
# A code.exec may carry up to 64 MiB of inputs (the kernel reads one such line at a time).
MAX_EXEC_LINE_BYTES = 129 * 1024 * 1024

#: `data.kind` for each error code, used when an error arrives without one.
ERROR_KINDS: dict[int, str] = {
    -32700: "parse_error",
    -32600: "invalid_request",
    -32601: "unknown_method",
    -32602: "invalid_params",
    1000: "unauthenticated",
    1001: "denied",
    1002: "not_found",
    1003: "run_exited",
    1004: "provider_error",
    1005: "no_provider",
    1006: "tool_error",
    1007: "budget_exhausted",
    1008: "internal",
    1009: "cancelled",
    1010: "would_block",
}

_NOT_UNDER_KEEL = (
    "not running under Keel: start this program with `keel run -- python3 your_agent.py`"
)


class KeelError(Exception):
    """The kernel answered a syscall with an error.

    `code` is the JSON-RPC code, `kind` the stable string from `data.kind` (match on
    this, e.g. ``err.kind == "budget_exhausted"``), `message` the kernel's explanation,
    `data` the whole `data` member, and `method` the syscall that failed.
    """

    def __init__(
        self, code: int, message: str, data: Any = None, *, method: str | None = None
    ) -> None:
        super().__init__(code, message, data)
        self.code = code
        self.message = message
        self.data = data
        self.method = method
        kind = data.get("kind") if isinstance(data, Mapping) else None
        self.kind: str = kind if isinstance(kind, str) else ERROR_KINDS.get(code, "unknown")

    def __str__(self) -> str:
        where = f"{self.method} failed: " if self.method else ""
        return f"{where}{self.message} [{self.kind}, code {self.code}]"


class ConnectionLost(ConnectionError):
    """The connection to the kernel is gone (or could not be made).

    Calls in flight and every later call raise this. Under Keel the right reaction is
    usually to exit: if the kernel crashed, it restarts the agent and replays.
    """


class ProtocolError(RuntimeError):
    """The kernel said something this SDK does not understand (a bug on one side)."""


class NotUnderKeel(RuntimeError):
    """`KEEL_SOCKET` or `KEEL_RUN_TOKEN` is missing: the program was not started by Keel."""

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(_NOT_UNDER_KEEL if detail is None else f"{_NOT_UNDER_KEEL} ({detail})")


class _Pending:
    """One request waiting for its response.

    `wake` is set when the response arrived (`finished`) or when the caller is asked to
    take over reading from the socket.
    """

    __slots__ = ("method", "wake", "finished", "result", "error")

    def __init__(self, method: str) -> None:
        self.method = method
        self.wake = threading.Event()
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None


def input(default: Any = None) -> Any:  # noqa: A001 - the SDK's name for the run's input
    """The run's input (``keel run --input JSON``; an agent called as a tool gets the
    call's arguments), or `default` when it has none."""
    text = os.environ.get("KEEL_INPUT")
    return default if text is None else json.loads(text)


def connect(socket_path: str | None = None, token: str | None = None) -> Client:
    """Connect to the kernel and say hello.

    Reads `KEEL_SOCKET` and `KEEL_RUN_TOKEN` from the environment unless given. Raises
    `NotUnderKeel` when they are missing, `ConnectionLost` when the socket cannot be
    reached, and `KeelError` (kind ``unauthenticated``) when the token is refused.
    """
    socket_path = socket_path or os.environ.get("KEEL_SOCKET")
    token = token or os.environ.get("KEEL_RUN_TOKEN")
    if not socket_path:
        raise NotUnderKeel()
    if not token:
        raise NotUnderKeel("KEEL_SOCKET is set but KEEL_RUN_TOKEN is not")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
    except OSError as err:
        sock.close()
        raise ConnectionLost(f"cannot connect to the Keel kernel at {socket_path}: {err}") from err
    client = Client(sock)
    try:
        client._hello(token)
    except BaseException:
        client.close()
        raise
    return client


class Client:
    """A connection to the kernel, shared safely by any number of threads.

    Build one with `keel.connect()`. Each method is one syscall and blocks until its
    answer arrives; calls from different threads are in flight at the same time.
    Use it as a context manager, or call `close()`.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""  # bytes read but not yet dispatched; only the leader touches it
        self._read_lock = threading.Lock()  # held by the caller currently reading (the leader)
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # guards _pending and _closed_reason
        self._pending: dict[int, _Pending] = {}
        self._closed_reason: str | None = None
        self._orphan_error: str | None = None  # an error the kernel sent with a null id
        self._ids = itertools.count(1)  # id 0 is reserved for hello
        self.run_id: str = ""
        self.protocol: int = 0

    # -- the generic call -------------------------------------------------------------

    def call(
        self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> Any:
        """Send one request and return its `result` (an object for every protocol-1 method).

        Raises `KeelError` for an error answer, `ConnectionLost` when the connection
        goes, and `TimeoutError` if `timeout` seconds pass first (the default waits
        forever: `human.ask` may legitimately take hours).
        """
        return self._request(next(self._ids), method, params, timeout)

    def _request(
        self,
        request_id: int,
        method: str,
        params: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> Any:
        message = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": method,
            "params": dict(params) if params is not None else {},
        }
        # allow_nan=False: NaN and Infinity are not JSON and the kernel would refuse them.
        line = (
            json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            + "\n"
        ).encode("utf-8")
        limit = MAX_EXEC_LINE_BYTES if method == "code.exec" else MAX_LINE_BYTES
        if len(line) > limit:
            raise KeelError(
                -32600,
                f"the request is {len(line)} bytes and the kernel refuses {method} lines over "
                f"{limit} bytes; send less (store big data with a tool and pass a key)",
                {"kind": "too_large"},
                method=method,
            )

        pending = _Pending(method)
        with self._lock:
            if self._closed_reason is not None:
                raise ConnectionLost(self._closed_reason)
            self._pending[request_id] = pending
        try:
            with self._send_lock:
                self._sock.sendall(line)
        except OSError as err:
            with self._lock:
                self._pending.pop(request_id, None)
            raise ConnectionLost(f"sending {method} to the Keel kernel failed: {err}") from err

        deadline = None if timeout is None else time.monotonic() + timeout
        while not pending.finished:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            if self._read_lock.acquire(blocking=False):
                try:
                    self._lead(pending, deadline)
                finally:
                    self._read_lock.release()
                    self._promote_next()
                continue
            pending.wake.wait(remaining)
            pending.wake.clear()
        if not pending.finished:
            with self._lock:
                self._pending.pop(request_id, None)
            raise TimeoutError(f"{method}: no answer from the Keel kernel within {timeout} s")
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _hello(self, token: str) -> None:
        result = _object(self._request(0, "hello", {"token": token}, None), "hello")
        protocol = result.get("protocol")
        if protocol != PROTOCOL_VERSION:
            raise ProtocolError(
                f"the kernel speaks protocol {protocol!r}; this SDK speaks {PROTOCOL_VERSION}"
            )
        self.run_id = str(_field(result, "run_id", "hello"))
        self.protocol = protocol

    # -- the syscalls -----------------------------------------------------------------

    def llm_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> dict[str, Any]:
        """Ask the LLM (OpenAI chat shape). Returns the whole result: ``message``,
        ``usage`` (``input_tokens``, ``output_tokens``), ``cost_usd`` and ``model``."""
        params: dict[str, Any] = {"messages": [dict(m) for m in messages]}
        # Unset options are left out rather than sent as null: the kernel matches
        # replayed calls by their exact parameters.
        if model is not None:
            params["model"] = model
        if tools is not None:
            params["tools"] = [dict(t) for t in tools]
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        if temperature is not None:
            params["temperature"] = temperature
        return _object(self.call("llm.chat", params), "llm.chat")

    def tool(self, name: str, args: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Any:
        """Call a tool and return its result: ``k.tool("kv.put", key="k", value=1)``.

        Arguments come as keywords, as a mapping (for names that are not identifiers),
        or both.
        """
        merged = dict(args) if args is not None else {}
        merged.update(kwargs)
        return _field(self.call("tool.call", {"name": name, "args": merged}), "result", "tool.call")

    def exec(
        self,
        code: str,
        *,
        lang: str = "python",
        inputs: Mapping[str, Any] | None = None,
        limits: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run a short program whose tool calls are governed, journaled syscalls.

        Tools are functions inside it (``fs.read(path="a.txt")`` in Python,
        ``fs.read({path: "a.txt"})`` in JavaScript); `inputs` are its global variables.
        Returns ``{"result", "stdout", "tool_calls", "duration_us"}``; a failing
        program raises `KeelError` whose ``data["exec_error"]`` says how it failed
        (``syntax``, ``runtime``, ``timeout``, ``memory``, ``tool_call_limit``...).
        `lang` is ``python`` (monty), ``javascript`` (QuickJS) or ``cpython``.
        """
        params: dict[str, Any] = {"lang": lang, "code": code, "inputs": dict(inputs or {})}
        if limits:
            params["limits"] = dict(limits)
        return _object(self.call("code.exec", params), "code.exec")

    def spawn(
        self,
        command: Sequence[str] | None = None,
        *,
        agent: str | None = None,
        input: Any = None,  # noqa: A002 - the child's input, as `keel.input()` returns it
        env: Mapping[str, str] | None = None,
        grant: Sequence[str] | None = None,
        priority: str | None = None,
        budget: Mapping[str, Any] | None = None,
    ) -> str:
        """Start a child run (`proc.spawn`) and return its run id.

        Give a `command` (run in this run's working directory and sandbox) or the name of
        an `agent` tool. The child gets `input` as `keel.input()`, this run's grant unless
        a narrower `grant` is given, and its own `budget` if one is given. Retried after a
        crash, the call returns the same child. Stopping this run stops its children.
        """
        params: dict[str, Any] = {}
        if command is not None:
            params["command"] = list(command)
        if agent is not None:
            params["agent"] = agent
        if input is not None:
            params["input"] = input
        if env:
            params["env"] = dict(env)
        if grant is not None:
            params["grant"] = list(grant)
        if priority is not None:
            params["priority"] = priority
        if budget is not None:
            params["budget"] = dict(budget)
        return str(_field(self.call("proc.spawn", params), "run_id", "proc.spawn"))

    def wait(self, run_id: str, *, timeout_ms: int | None = None) -> dict[str, Any]:
        """Wait for a child run to end: ``{"run_id", "state", "output", "error",
        "exit_code"}``, or ``{"timed_out": True, ...}`` after `timeout_ms`. Journaled: after a
        crash the wait answers the same."""
        params: dict[str, Any] = {"run_id": run_id}
        if timeout_ms is not None:
            params["timeout_ms"] = timeout_ms
        return _object(self.call("proc.wait", params), "proc.wait")

    def signal(self, run_id: str, signal: str) -> dict[str, Any]:
        """``stop``, ``pause`` or ``resume`` a descendant run."""
        return _object(self.call("proc.signal", {"run_id": run_id, "signal": signal}), "proc.signal")

    def register(self, name: str) -> None:
        """Take `name` in this run's tenant: other runs `send(name, ...)` to it while this
        run lives (`ipc.register`). A name held by a live run raises kind ``denied``."""
        self.call("ipc.register", {"name": name})

    def sleep(self, ms: int) -> None:
        """A durable timer: after a crash the run sleeps only what was left (`sys.sleep`)."""
        self.call("sys.sleep", {"ms": int(ms)})

    def list_tools(self) -> list[dict[str, Any]]:
        """The tools this run may call: ``name``, ``description``, ``input_schema``."""
        tools: list[dict[str, Any]] = _field(self.call("tool.list", {}), "tools", "tool.list")
        return tools

    def checkpoint(self, state: Any) -> int:
        """Save `state` (any JSON); after a crash, `restore()` returns it and replay
        starts here. Returns the checkpoint's sequence number."""
        result = self.call("state.checkpoint", {"state": state})
        return int(_field(result, "seq", "state.checkpoint"))

    def restore(self) -> Any:
        """The last checkpointed state, or None on a fresh run."""
        return _field(self.call("state.restore", {}), "state", "state.restore")

    def now_ms(self) -> int:
        """Wall-clock time in Unix milliseconds, journaled (use instead of `time.time()`)."""
        return int(_field(self.call("sys.now", {}), "unix_ms", "sys.now"))

    def ping(self) -> None:
        """A no-op round trip to the kernel (not journaled): checks the channel is alive."""
        self.call("sys.ping", {})

    def random(self) -> int:
        """A random unsigned 64-bit integer, journaled (use instead of `random`)."""
        return int(_field(self.call("sys.random", {}), "value", "sys.random"))

    def ask(
        self, question: str, *, form: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Ask a human and wait (durably, maybe for hours) for `keel answer`; returns the
        answer's text. With `form` (a JSON schema of an object), the person fills in a
        form instead (`keel answer RUN --json '{...}'`, or the console), and this returns
        the structured value, which the kernel has checked against `form`."""
        params: dict[str, Any] = {"question": question}
        if form is not None:
            params["form"] = form
        result = self.call("human.ask", params, timeout=timeout)
        if form is not None:
            return _field(result, "value", "human.ask")
        return str(_field(result, "answer", "human.ask"))

    # -- UI blocks (shown on the run's console page, in order) --------------------------

    def show(self, block: dict[str, Any]) -> int:
        """Show `block` on the run's console page (`ui.show`): a dict with a ``type`` of
        table, chart, markdown, progress or form (see the helpers). Journaled, so after
        a crash a replayed call is not shown twice. Returns the block's sequence number.
        A bad block raises `KeelError` (kind ``invalid_params``, naming the field)."""
        return int(_field(self.call("ui.show", {"block": block}), "seq", "ui.show"))

    def show_table(
        self, columns: list[str], rows: list[list[Any]], title: str | None = None
    ) -> int:
        """A table: each row has one cell (str, number, bool or None) per column."""
        return self.show(_titled({"type": "table", "columns": columns, "rows": rows}, title))

    def show_chart(
        self,
        kind: str,
        labels: list[str],
        series: list[dict[str, Any]] | dict[str, list[float]],
        title: str | None = None,
    ) -> int:
        """A ``"line"`` or ``"bar"`` chart. `series` is a list of
        ``{"name": str, "values": [number]}`` or a dict of name to values; each has one
        value per label."""
        if isinstance(series, dict):
            series = [{"name": name, "values": values} for name, values in series.items()]
        block = {"type": "chart", "kind": kind, "labels": labels, "series": series}
        return self.show(_titled(block, title))

    def show_markdown(self, text: str) -> int:
        """A markdown text."""
        return self.show({"type": "markdown", "text": text})

    def show_progress(self, value: float, label: str | None = None) -> int:
        """Progress from 0 to 1, with an optional label."""
        block: dict[str, Any] = {"type": "progress", "value": value}
        if label is not None:
            block["label"] = label
        return self.show(block)

    def show_form(self, id: str, schema: dict[str, Any], title: str | None = None) -> int:  # noqa: A002
        """A form (`schema`: a JSON schema of an object) the person fills in on the
        console. The submitted value arrives in the run's mailbox as an operator message
        ``{"ui_form": id, "value": {...}}``: receive it with `recv()`. To wait for one
        answer, `ask(question, form=schema)` is simpler."""
        return self.show(_titled({"type": "form", "id": id, "schema": schema}, title))

    def emit(self, event: Any) -> None:
        """Publish an event (any JSON) on the run's event stream."""
        self.call("run.emit", {"event": event})

    def exit(self, output: Any = None) -> None:
        """Finish the run with `output` (any JSON). Later calls fail with kind
        ``run_exited``; the program should end its process after this."""
        self.call("run.exit", {"output": output})

    # -- memory -----------------------------------------------------------------------

    def thread_append(self, thread: str, role: str, content: str) -> int:
        """Append a message to the conversation thread `thread` (shared by id between
        the runs of a tenant; created on first append). Returns its index (0 first)."""
        params = {"thread": thread, "message": {"role": role, "content": content}}
        return int(_field(self.call("mem.thread.append", params), "index", "mem.thread.append"))

    def thread_read(
        self, thread: str, *, last: int | None = None, max_tokens: int | None = None
    ) -> list[dict[str, Any]]:
        """The thread's messages, oldest first (``index``, ``role``, ``content``): the
        newest `last` of them and/or the newest that fit in `max_tokens` (estimated)."""
        params: dict[str, Any] = {"thread": thread}
        if last is not None:
            params["last"] = last
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        messages: list[dict[str, Any]] = _field(
            self.call("mem.thread.read", params), "messages", "mem.thread.read"
        )
        return messages

    def mem_put(self, namespace: str, key: str, value: Any, *, text: str | None = None) -> None:
        """Store `value` (any JSON) under `namespace`/`key` in long-term memory. `text` is
        what `mem_search` finds it by (default: the value itself, or its JSON)."""
        params: dict[str, Any] = {"namespace": namespace, "key": key, "value": value}
        if text is not None:
            params["text"] = text
        self.call("mem.put", params)

    def mem_get(self, namespace: str, key: str) -> Any:
        """The value stored under `namespace`/`key`, or None."""
        result = self.call("mem.get", {"namespace": namespace, "key": key})
        return _field(result, "value", "mem.get")

    def mem_delete(self, namespace: str, key: str) -> bool:
        """Delete a record; whether there was one."""
        result = self.call("mem.delete", {"namespace": namespace, "key": key})
        return bool(_field(result, "deleted", "mem.delete"))

    def mem_search(
        self, namespace: str, query: str, *, limit: int | None = None, mode: str | None = None
    ) -> list[dict[str, Any]]:
        """Search of a namespace: hits (``key``, ``score``, ``snippet``), most relevant
        first. `mode` is ``"text"`` (full-text, the default: any word of `query` may
        match), ``"semantic"`` (embedding similarity) or ``"hybrid"`` (both, fused)."""
        params: dict[str, Any] = {"namespace": namespace, "query": query}
        if limit is not None:
            params["limit"] = limit
        if mode is not None:
            params["mode"] = mode
        hits: list[dict[str, Any]] = _field(self.call("mem.search", params), "hits", "mem.search")
        return hits

    # -- IPC --------------------------------------------------------------------------

    def send(
        self,
        to: str,
        message: Any,
        *,
        correlation_id: str | None = None,
        wait: bool = True,
    ) -> int:
        """Put `message` (any JSON) in the mailbox of run `to` (a run of the same tenant)
        and return its seq there. When the mailbox is full this waits for room, or with
        ``wait=False`` raises `KeelError` of kind ``would_block`` (nothing was sent).

        Request/reply: send with a fresh `correlation_id`; the replier sends its answer
        to the request's ``from`` with the same `correlation_id`."""
        params: dict[str, Any] = {"to": to, "message": message}
        if correlation_id is not None:
            params["correlation_id"] = correlation_id
        if not wait:
            params["wait"] = False
        return int(_field(self.call("ipc.send", params), "seq", "ipc.send"))

    def send_recv(
        self,
        to: str,
        message: Any,
        *,
        correlation_id: str | None = None,
        timeout_ms: int | None = None,
    ) -> dict[str, Any] | None:
        """`send`, then `recv`, in one call: the next message of this run's mailbox after
        the send (the reply, when the peer answers at once), or None when `timeout_ms`
        passes first. Journaled and replayed as the two calls. The receive is on offer
        before the peer hears of the send, so the peer's reply completes it in the
        reply's own commit: a request/reply round trip of two commits, where a separate
        `recv` can arrive after a quick reply and cost one more. A replier loops on it
        too: ``msg = k.send_recv(msg["from"], answer, correlation_id=...)`` answers one
        request and receives the next."""
        recv: dict[str, Any] = {}
        if timeout_ms is not None:
            recv["timeout_ms"] = timeout_ms
        params: dict[str, Any] = {"to": to, "message": message, "recv": recv}
        if correlation_id is not None:
            params["correlation_id"] = correlation_id
        received: dict[str, Any] | None = _field(self.call("ipc.send", params), "message", "ipc.send")
        return received

    def recv(self, timeout_ms: int | None = None) -> dict[str, Any] | None:
        """The next message of this run's mailbox (``from``, ``seq``, ``message`` and
        ``correlation_id`` when the sender gave one), waiting up to `timeout_ms` (forever
        when None); None on timeout. ``from`` is None for an operator's message. Each
        message is received once, and a restarted run receives the same messages again."""
        params: dict[str, Any] = {}
        if timeout_ms is not None:
            params["timeout_ms"] = timeout_ms
        message: dict[str, Any] | None = _field(self.call("ipc.recv", params), "message", "ipc.recv")
        return message

    def recv_many(self, max: int, timeout_ms: int | None = None) -> list[dict[str, Any]]:
        """Up to `max` (1 to 1000) of the oldest messages of this run's mailbox, oldest
        first, each as `recv` returns it: at least one, waiting up to `timeout_ms` (forever
        when None) for the first; an empty list on timeout. Whatever is waiting is taken
        in one journaled step (one commit for the batch, where `recv` makes one per
        message), so a consumer with a backlog drains it faster. Past the first message,
        a batch stops before the messages' bodies exceed 1 MiB of JSON in all."""
        params: dict[str, Any] = {"max": max}
        if timeout_ms is not None:
            params["timeout_ms"] = timeout_ms
        messages: list[dict[str, Any]] = _field(self.call("ipc.recv", params), "messages", "ipc.recv")
        return messages

    def subscribe(self, topic: str) -> None:
        """Deliver messages published on the tenant's `topic` to this run's mailbox from
        now on (received by `recv` with ``topic`` set)."""
        self.call("ipc.subscribe", {"topic": topic})

    def unsubscribe(self, topic: str) -> None:
        """Stop delivering `topic`'s messages to this run."""
        self.call("ipc.unsubscribe", {"topic": topic})

    def publish(self, topic: str, message: Any, *, wait: bool = True) -> int:
        """Put `message` in the mailbox of every run of the tenant subscribed to `topic`
        (all or nothing); returns how many got it. A full subscriber mailbox makes this
        wait, or with ``wait=False`` raise kind ``would_block``."""
        params: dict[str, Any] = {"topic": topic, "message": message}
        if not wait:
            params["wait"] = False
        return int(_field(self.call("ipc.publish", params), "delivered", "ipc.publish"))

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection. Calls still waiting raise `ConnectionLost`. Idempotent."""
        with self._lock:
            if self._closed_reason is None:
                self._closed_reason = "the client was closed"
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a caller blocked reading
        except OSError:
            pass
        self._fail_all("the client was closed")
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading ----------------------------------------------------------------------

    def _lead(self, mine: _Pending, deadline: float | None) -> None:
        """Read and dispatch responses until `mine` is answered or the deadline passes.

        Called with `_read_lock` held. On a broken connection every caller is failed.
        """
        try:
            while not mine.finished:
                newline = self._buffer.find(b"\n")
                if newline >= 0:
                    line, self._buffer = self._buffer[:newline], self._buffer[newline + 1 :]
                    problem = self._dispatch(line)
                    if problem is not None:
                        self._fail_all(problem)
                    continue
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    readable, _, _ = select.select([self._sock], [], [], remaining)
                    if not readable:
                        return
                chunk = self._sock.recv(1 << 16)
                if not chunk:
                    self._fail_all("the Keel kernel closed the connection")
                    return
                self._buffer += chunk
        except (OSError, ValueError) as err:
            self._fail_all(f"reading from the Keel kernel failed: {err}")

    def _promote_next(self) -> None:
        """Wake one caller still waiting, so that someone reads for it."""
        with self._lock:
            waiting = next((p for p in self._pending.values() if not p.finished), None)
        if waiting is not None:
            waiting.wake.set()

    def _dispatch(self, line: bytes) -> str | None:
        """Hand one response to its caller. Returns a reason to give up, if any."""
        try:
            message = json.loads(line)
        except ValueError:
            return f"the Keel kernel sent a line that is not JSON: {line[:200]!r}"
        if not isinstance(message, dict):
            return f"the Keel kernel sent JSON that is not an object: {line[:200]!r}"
        request_id = message.get("id")
        if request_id is None:
            error = message.get("error")
            if isinstance(error, dict):
                # An error about a request the kernel could not attribute to an id. The
                # kernel closes the connection after such errors, so keep the explanation
                # for the callers that will see ConnectionLost.
                with self._lock:
                    self._orphan_error = f"the Keel kernel reported: {error.get('message')}"
            return None  # a notification: protocol 1 defines none, so ignore it
        with self._lock:
            pending = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if pending is None:
            return None  # a caller that timed out and left
        error = message.get("error")
        if isinstance(error, dict):
            pending.error = KeelError(
                int(error.get("code", 0)),
                str(error.get("message", "")),
                error.get("data"),
                method=pending.method,
            )
        elif "result" in message:
            pending.result = message["result"]
        else:
            pending.error = ProtocolError(f"response without result or error: {line[:200]!r}")
        pending.finished = True
        pending.wake.set()
        return None

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            if self._closed_reason is None:
                orphan = self._orphan_error
                self._closed_reason = f"{reason}; {orphan}" if orphan else reason
            pending = list(self._pending.values())
            self._pending.clear()
            closed_reason = self._closed_reason
        for waiter in pending:
            waiter.error = ConnectionLost(closed_reason)
            waiter.finished = True
            waiter.wake.set()


def _titled(block: dict[str, Any], title: str | None) -> dict[str, Any]:
    if title is not None:
        block["title"] = title
    return block


def _object(value: Any, method: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{method}: expected an object as the result, got {value!r}")
    return value


def _field(result: Any, name: str, method: str) -> Any:
    if not isinstance(result, dict) or name not in result:
        raise ProtocolError(f"{method}: the result lacks {name!r}: {result!r}")
    return result[name]
