"""The SDK client against a fake kernel: handshake, pipelining, errors, lost connections."""

from __future__ import annotations

import os
import threading
import unittest
from typing import Any
from unittest import mock

import keel
from tests.fake_kernel import FakeKernel, LineConnection

TOKEN = "secret-token"


def answer(conn: LineConnection, request: dict[str, Any], result: Any) -> None:
    conn.send({"jsonrpc": "2.0", "id": request["id"], "result": result})


def fail(
    conn: LineConnection, request: dict[str, Any], code: int, message: str, data: Any = None
) -> None:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    conn.send({"jsonrpc": "2.0", "id": request["id"], "error": body})


class KernelTestCase(unittest.TestCase):
    """Starts a fake kernel whose connections greet, then run `self.serve` (if set)."""

    def start(self, serve: Any = None, run_id: str = "run_1") -> FakeKernel:
        self.requests: list[dict[str, Any]] = []

        def handler(conn: LineConnection) -> None:
            hello = conn.read()
            self.requests.append(hello)
            answer(conn, hello, {"run_id": run_id, "protocol": 1})
            if serve is not None:
                serve(conn)

        kernel = FakeKernel(handler)
        self.addCleanup(kernel.close)
        return kernel

    def connect(self, kernel: FakeKernel) -> keel.Client:
        client = keel.connect(kernel.path, TOKEN)
        self.addCleanup(client.close)
        return client


class ConnectTests(KernelTestCase):
    def test_hello_sends_the_token_from_the_environment(self) -> None:
        kernel = self.start()
        with mock.patch.dict(os.environ, kernel.env(token=TOKEN)):
            client = keel.connect()
        self.addCleanup(client.close)
        self.assertEqual(client.run_id, "run_1")
        self.assertEqual(client.protocol, 1)
        self.assertEqual(
            self.requests,
            [{"jsonrpc": "2.0", "id": 0, "method": "hello", "params": {"token": TOKEN}}],
        )

    def test_missing_socket_variable_says_how_to_run_under_keel(self) -> None:
        with mock.patch.dict(os.environ, {}, clear=True):
            with self.assertRaises(keel.NotUnderKeel) as caught:
                keel.connect()
        self.assertIn("not running under Keel", str(caught.exception))
        self.assertIn("keel run -- python3 your_agent.py", str(caught.exception))

    def test_missing_token_variable_is_reported(self) -> None:
        with mock.patch.dict(os.environ, {"KEEL_SOCKET": "/nonexistent.sock"}, clear=True):
            with self.assertRaises(keel.NotUnderKeel) as caught:
                keel.connect()
        self.assertIn("KEEL_RUN_TOKEN", str(caught.exception))

    def test_unreachable_socket_raises_connection_lost(self) -> None:
        with self.assertRaises(keel.ConnectionLost) as caught:
            keel.connect("/nonexistent/keel.sock", TOKEN)
        self.assertIn("/nonexistent/keel.sock", str(caught.exception))

    def test_refused_token_raises_unauthenticated(self) -> None:
        def handler(conn: LineConnection) -> None:
            fail(conn, conn.read(), 1000, "unknown run token", {"kind": "unauthenticated"})

        kernel = FakeKernel(handler)
        self.addCleanup(kernel.close)
        with self.assertRaises(keel.KeelError) as caught:
            keel.connect(kernel.path, "forged")
        self.assertEqual((caught.exception.code, caught.exception.kind), (1000, "unauthenticated"))
        self.assertEqual(caught.exception.method, "hello")

    def test_other_protocol_versions_are_refused(self) -> None:
        def handler(conn: LineConnection) -> None:
            answer(conn, conn.read(), {"run_id": "r", "protocol": 2})

        kernel = FakeKernel(handler)
        self.addCleanup(kernel.close)
        with self.assertRaises(keel.ProtocolError):
            keel.connect(kernel.path, TOKEN)


class CallTests(KernelTestCase):
    def test_pipelined_calls_are_matched_by_id_when_answered_out_of_order(self) -> None:
        count = 8
        all_received = threading.Event()

        def serve(conn: LineConnection) -> None:
            received = [conn.read() for _ in range(count)]  # nothing answered yet
            self.requests.extend(received)
            all_received.set()
            for request in reversed(received):
                answer(conn, request, {"result": request["params"]["args"]})

        client = self.connect(self.start(serve))
        results: dict[int, Any] = {}
        barrier = threading.Barrier(count)

        def worker(n: int) -> None:
            barrier.wait()
            results[n] = client.tool("echo", n=n)

        threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        self.assertTrue(all_received.is_set(), "the calls were not in flight together")
        self.assertEqual(results, {n: {"n": n} for n in range(count)})
        ids = [r["id"] for r in self.requests[1:]]
        self.assertEqual(len(set(ids)), count, "request ids must be unique")
        self.assertNotIn(0, ids, "id 0 belongs to hello")

    def test_each_syscall_sends_the_contract_params_and_unwraps_the_result(self) -> None:
        canned = {
            "llm.chat": {
                "message": {"role": "assistant", "content": "hi"},
                "usage": {"input_tokens": 3, "output_tokens": 1},
                "cost_usd": 0.0,
                "model": "scripted",
            },
            "tool.call": {"result": True},
            "tool.list": {"tools": [{"name": "echo", "description": "", "input_schema": {}}]},
            "state.checkpoint": {"seq": 7},
            "state.restore": {"state": {"step": 2}},
            "sys.now": {"unix_ms": 1700000000000},
            "sys.random": {"value": 18446744073709551615},
            "human.ask": {"answer": "yes"},
            "run.emit": {},
            "run.exit": {},
            "mem.thread.append": {"index": 4},
            "mem.thread.read": {"messages": [{"index": 4, "role": "user", "content": "hi"}]},
            "mem.put": {},
            "mem.get": {"value": {"v": 1}},
            "mem.delete": {"deleted": True},
            "mem.search": {"hits": [{"key": "k", "score": 1.5, "snippet": "[hi]"}]},
            # With `recv`, a send answers the message received too.
            "ipc.send": {"seq": 3, "message": {"from": "run_b", "seq": 4, "message": "r"}},
            "ipc.subscribe": {},
            "ipc.unsubscribe": {},
            "ipc.publish": {"delivered": 2},
            "ipc.recv": {
                "message": {"from": "run_a", "seq": 1, "message": {"q": 1}, "correlation_id": "c1"},
                "messages": [{"from": "run_a", "seq": 1, "message": {"q": 1}}, {"from": None, "seq": 2, "message": "x"}],
            },
        }

        def serve(conn: LineConnection) -> None:
            while (request := conn.read()) is not None:
                self.requests.append(request)
                answer(conn, request, canned[request["method"]])

        client = self.connect(self.start(serve))
        chat = client.llm_chat([{"role": "user", "content": "hello"}], max_tokens=5)
        self.assertEqual(chat["message"]["content"], "hi")
        self.assertIs(client.tool("kv.put", {"key": "k"}, value=[1, 2]), True)
        self.assertEqual(client.list_tools()[0]["name"], "echo")
        self.assertEqual(client.checkpoint({"step": 2}), 7)
        self.assertEqual(client.restore(), {"step": 2})
        self.assertEqual(client.now_ms(), 1700000000000)
        self.assertEqual(client.random(), 2**64 - 1)
        self.assertEqual(client.ask("approve?"), "yes")
        self.assertIsNone(client.emit({"progress": 1}))
        self.assertEqual(client.thread_append("t1", "user", "hi"), 4)
        self.assertEqual(client.thread_read("t1", last=2)[0]["content"], "hi")
        self.assertEqual(len(client.thread_read("t1", max_tokens=100)), 1)
        self.assertIsNone(client.mem_put("notes", "k", {"v": 1}, text="hello"))
        self.assertIsNone(client.mem_put("notes", "k", 2))
        self.assertEqual(client.mem_get("notes", "k"), {"v": 1})
        self.assertIs(client.mem_delete("notes", "k"), True)
        self.assertEqual(client.mem_search("notes", "hi", limit=3)[0]["key"], "k")
        self.assertEqual(client.mem_search("notes", "hi"), [{"key": "k", "score": 1.5, "snippet": "[hi]"}])
        self.assertEqual(client.send("run_b", {"q": 1}), 3)
        self.assertEqual(client.send("run_b", "x", correlation_id="c1", wait=False), 3)
        self.assertEqual(client.send_recv("run_b", {"q": 2})["message"], "r")
        self.assertEqual(client.send_recv("run_b", 1, correlation_id="c2", timeout_ms=9)["seq"], 4)
        self.assertEqual(client.recv()["correlation_id"], "c1")
        self.assertEqual(client.recv(timeout_ms=50)["message"], {"q": 1})
        self.assertEqual([m["seq"] for m in client.recv_many(10)], [1, 2])
        self.assertEqual(len(client.recv_many(2, timeout_ms=5)), 2)
        self.assertIsNone(client.subscribe("news"))
        self.assertEqual(client.publish("news", {"h": 1}), 2)
        self.assertEqual(client.publish("news", "x", wait=False), 2)
        self.assertIsNone(client.unsubscribe("news"))
        self.assertIsNone(client.exit({"ok": True}))

        sent = [(r["method"], r["params"]) for r in self.requests[1:]]
        self.assertEqual(
            sent,
            [
                # Options left unset are absent, not null: replay matches exact params.
                ("llm.chat", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}),
                ("tool.call", {"name": "kv.put", "args": {"key": "k", "value": [1, 2]}}),
                ("tool.list", {}),
                ("state.checkpoint", {"state": {"step": 2}}),
                ("state.restore", {}),
                ("sys.now", {}),
                ("sys.random", {}),
                ("human.ask", {"question": "approve?"}),
                ("run.emit", {"event": {"progress": 1}}),
                (
                    "mem.thread.append",
                    {"thread": "t1", "message": {"role": "user", "content": "hi"}},
                ),
                ("mem.thread.read", {"thread": "t1", "last": 2}),
                ("mem.thread.read", {"thread": "t1", "max_tokens": 100}),
                ("mem.put", {"namespace": "notes", "key": "k", "value": {"v": 1}, "text": "hello"}),
                ("mem.put", {"namespace": "notes", "key": "k", "value": 2}),
                ("mem.get", {"namespace": "notes", "key": "k"}),
                ("mem.delete", {"namespace": "notes", "key": "k"}),
                ("mem.search", {"namespace": "notes", "query": "hi", "limit": 3}),
                ("mem.search", {"namespace": "notes", "query": "hi"}),
                ("ipc.send", {"to": "run_b", "message": {"q": 1}}),
                ("ipc.send", {"to": "run_b", "message": "x", "correlation_id": "c1", "wait": False}),
                ("ipc.send", {"to": "run_b", "message": {"q": 2}, "recv": {}}),
                (
                    "ipc.send",
                    {"to": "run_b", "message": 1, "recv": {"timeout_ms": 9}, "correlation_id": "c2"},
                ),
                ("ipc.recv", {}),
                ("ipc.recv", {"timeout_ms": 50}),
                ("ipc.recv", {"max": 10}),
                ("ipc.recv", {"max": 2, "timeout_ms": 5}),
                ("ipc.subscribe", {"topic": "news"}),
                ("ipc.publish", {"topic": "news", "message": {"h": 1}}),
                ("ipc.publish", {"topic": "news", "message": "x", "wait": False}),
                ("ipc.unsubscribe", {"topic": "news"}),
                ("run.exit", {"output": {"ok": True}}),
            ],
        )
        self.assertTrue(all(r["jsonrpc"] == "2.0" for r in self.requests))

    def test_ui_blocks_and_form_questions_send_the_contract_params(self) -> None:
        seqs = iter(range(1, 100))
        form = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}

        def serve(conn: LineConnection) -> None:
            while (request := conn.read()) is not None:
                self.requests.append(request)
                if request["method"] == "ui.show":
                    answer(conn, request, {"seq": next(seqs)})
                elif "form" in request["params"]:
                    answer(conn, request, {"answer": '{"ok":true}', "value": {"ok": True}})
                else:
                    answer(conn, request, {"answer": "plain"})

        client = self.connect(self.start(serve))
        self.assertEqual(client.show_table(["a", "b"], [[1, "x"]], title="T"), 1)
        self.assertEqual(client.show_table(["a"], []), 2)
        self.assertEqual(client.show_chart("bar", ["q1"], {"rev": [3]}, title="C"), 3)
        self.assertEqual(client.show_chart("line", ["q1"], [{"name": "s", "values": [1.5]}]), 4)
        self.assertEqual(client.show_markdown("# hi"), 5)
        self.assertEqual(client.show_progress(0.25, label="quarter"), 6)
        self.assertEqual(client.show_progress(1), 7)
        self.assertEqual(client.show_form("f1", form, title="F"), 8)
        self.assertEqual(client.show({"type": "markdown", "text": "raw"}), 9)
        self.assertEqual(client.ask("ok?", form=form), {"ok": True}, "a form gives the value")
        self.assertEqual(client.ask("ok?"), "plain", "no form gives the text, as before")

        sent = [(r["method"], r["params"]) for r in self.requests[1:]]
        block = lambda b: ("ui.show", {"block": b})  # noqa: E731
        self.assertEqual(
            sent,
            [
                block({"type": "table", "columns": ["a", "b"], "rows": [[1, "x"]], "title": "T"}),
                block({"type": "table", "columns": ["a"], "rows": []}),
                block(
                    {
                        "type": "chart",
                        "kind": "bar",
                        "labels": ["q1"],
                        "series": [{"name": "rev", "values": [3]}],
                        "title": "C",
                    }
                ),
                block(
                    {
                        "type": "chart",
                        "kind": "line",
                        "labels": ["q1"],
                        "series": [{"name": "s", "values": [1.5]}],
                    }
                ),
                block({"type": "markdown", "text": "# hi"}),
                block({"type": "progress", "value": 0.25, "label": "quarter"}),
                block({"type": "progress", "value": 1}),
                block({"type": "form", "id": "f1", "schema": form, "title": "F"}),
                block({"type": "markdown", "text": "raw"}),
                ("human.ask", {"question": "ok?", "form": form}),
                ("human.ask", {"question": "ok?"}),
            ],
        )

    def test_error_answers_raise_keel_error_with_code_kind_and_data(self) -> None:
        def serve(conn: LineConnection) -> None:
            fail(
                conn,
                conn.read(),
                1007,
                "the run's budget of $1.00 is spent; top it up with `keel budget`",
                {"kind": "budget_exhausted", "limit_usd": 1.0},
            )
            fail(conn, conn.read(), -32601, "no method 'nope'")  # no data at all
            fail(conn, conn.read(), 1010, "the mailbox of run run_b is full")  # kind from the code

        client = self.connect(self.start(serve))
        with self.assertRaises(keel.KeelError) as caught:
            client.llm_chat([{"role": "user", "content": "hi"}])
        err = caught.exception
        self.assertEqual((err.code, err.kind, err.method), (1007, "budget_exhausted", "llm.chat"))
        self.assertEqual(err.data, {"kind": "budget_exhausted", "limit_usd": 1.0})
        self.assertEqual(
            str(err),
            "llm.chat failed: the run's budget of $1.00 is spent; top it up with `keel budget` "
            "[budget_exhausted, code 1007]",
        )

        with self.assertRaises(keel.KeelError) as caught:
            client.call("nope")
        self.assertEqual((caught.exception.code, caught.exception.kind), (-32601, "unknown_method"))
        self.assertIsNone(caught.exception.data)

        with self.assertRaises(keel.KeelError) as caught:
            client.send("run_b", {"n": 1}, wait=False)
        self.assertEqual((caught.exception.kind, caught.exception.method), ("would_block", "ipc.send"))

    def test_oversized_request_is_refused_locally_and_the_connection_survives(self) -> None:
        def serve(conn: LineConnection) -> None:
            while (request := conn.read()) is not None:
                answer(conn, request, {"unix_ms": 5})

        client = self.connect(self.start(serve))
        with self.assertRaises(keel.KeelError) as caught:
            client.emit("x" * keel.MAX_LINE_BYTES)
        self.assertEqual((caught.exception.code, caught.exception.kind), (-32600, "too_large"))
        self.assertEqual(client.now_ms(), 5)

    def test_timeout_gives_up_waiting_without_breaking_the_connection(self) -> None:
        def serve(conn: LineConnection) -> None:
            slow = conn.read()  # never answered
            answer(conn, conn.read(), {"unix_ms": 9})
            answer(conn, slow, {"answer": "too late"})  # dropped: nobody waits for it

        client = self.connect(self.start(serve))
        with self.assertRaises(TimeoutError):
            client.ask("anyone?", timeout=0.2)
        self.assertEqual(client.now_ms(), 9)


class ConnectionLossTests(KernelTestCase):
    def test_calls_in_flight_and_later_calls_raise_connection_lost(self) -> None:
        def serve(conn: LineConnection) -> None:
            conn.read()  # then hang up without answering

        client = self.connect(self.start(serve))
        with self.assertRaises(keel.ConnectionLost) as caught:
            client.llm_chat([{"role": "user", "content": "hi"}])
        self.assertIn("closed the connection", str(caught.exception))
        with self.assertRaises(keel.ConnectionLost):
            client.now_ms()

    def test_an_error_without_id_before_the_close_explains_it(self) -> None:
        def serve(conn: LineConnection) -> None:
            conn.read()
            data = {"kind": "too_large"}
            too_large = {"code": -32600, "message": "line over 1 MiB", "data": data}
            conn.send({"jsonrpc": "2.0", "id": None, "error": too_large})

        client = self.connect(self.start(serve))
        with self.assertRaises(keel.ConnectionLost) as caught:
            client.now_ms()
        self.assertIn("line over 1 MiB", str(caught.exception))

    def test_close_releases_waiting_callers(self) -> None:
        received = threading.Event()

        def serve(conn: LineConnection) -> None:
            conn.read()
            received.set()
            conn.read()  # waits until the client goes away

        client = self.connect(self.start(serve))
        outcome: list[BaseException] = []

        def ask() -> None:
            try:
                client.ask("approve?")
            except BaseException as err:  # noqa: BLE001 - recorded for the assertion
                outcome.append(err)

        thread = threading.Thread(target=ask, daemon=True)
        thread.start()
        self.assertTrue(received.wait(5))
        client.close()
        thread.join(timeout=5)
        self.assertEqual(len(outcome), 1)
        self.assertIsInstance(outcome[0], keel.ConnectionLost)
        client.close()  # idempotent

    def test_context_manager_closes_the_connection(self) -> None:
        kernel = self.start()
        with keel.connect(kernel.path, TOKEN) as client:
            pass
        with self.assertRaises(keel.ConnectionLost):
            client.now_ms()


if __name__ == "__main__":
    unittest.main()
