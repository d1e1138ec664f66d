"""The repository's Python agents (quickstart, end-to-end test agents) against the
scripted fake kernel: each runs to its documented output, and each that claims to be
durable gives the same output after a crash at every journal entry, without paying for
any LLM call twice.

These check the agents themselves; the real kernel is checked by the Rust end-to-end
tests that run the same programs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any

from tests.fake_kernel import NO_OUTPUT, SDK_DIR, ScriptedKernel

REPO = SDK_DIR.parents[1]
QUICKSTART = REPO / "examples" / "quickstart"
AGENTS = REPO / "crates" / "keel-cli" / "tests" / "agents"


def load_script(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def journaled_result(kernel: ScriptedKernel, method: str) -> Any:
    return next(e.result for e in kernel.journal if e.method == method)


class DurableAgentCase(unittest.TestCase):
    """Helpers to run an agent once, and to crash it after each journal entry in turn."""

    def run_clean(self, kernel: ScriptedKernel, argv: list[str]) -> Any:
        run = kernel.run_agent(argv)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIsNot(kernel.output, NO_OUTPUT, "the agent never called run.exit")
        return kernel.output

    def crash_everywhere(
        self, make_kernel: Any, argv: list[str]
    ) -> list[tuple[int, ScriptedKernel, Any, str]]:
        """Crash after journal entry n, for every n a clean run journals; recover each time
        and collect (n, kernel, output, stdout of the recovered run)."""
        entries = self.journal_length(make_kernel, argv)
        outcomes = []
        for n in range(1, entries + 1):
            with self.subTest(crash_after=n):
                kernel = make_kernel(crash_after=n)
                first = kernel.run_agent(argv)
                self.assertTrue(first.crashed, f"no crash after entry {n}:\n{first.stderr}")
                second = kernel.run_agent(argv)
                self.assertEqual(second.returncode, 0, second.stderr)
                self.assertIsNot(kernel.output, NO_OUTPUT)
                outcomes.append((n, kernel, kernel.output, second.stdout))
        return outcomes

    def journal_length(self, make_kernel: Any, argv: list[str]) -> int:
        kernel = make_kernel()
        self.run_clean(kernel, argv)
        return len(kernel.journal)


class QuickstartTests(DurableAgentCase):
    argv = [str(QUICKSTART / "agent.py")]

    def kernel(self, **options: Any) -> ScriptedKernel:
        return ScriptedKernel(load_script(QUICKSTART / "script.json"), **options)

    def test_runs_to_the_end_and_narrates_the_syscalls(self) -> None:
        kernel = self.kernel()
        run = kernel.run_agent(self.argv)
        self.assertEqual(run.returncode, 0, run.stderr)
        output = kernel.output
        script = load_script(QUICKSTART / "script.json")["responses"]
        tokens = sum(r["usage"]["input_tokens"] + r["usage"]["output_tokens"] for r in script)
        self.assertEqual(output["total_tokens"], tokens)
        self.assertEqual([s["step"] for s in output["steps"]], [1, 2, 3])
        self.assertEqual(output["steps"][0]["finding"], script[1]["content"])
        self.assertEqual(output["summary"], script[4]["content"])
        self.assertIsNone(output["approved"])
        self.assertEqual(output["started_unix_ms"], journaled_result(kernel, "sys.now")["unix_ms"])
        self.assertEqual(len(kernel.llm_requests), 5)  # plan, three steps, summary
        self.assertIn("[step 2/3] llm.chat -> 66 tokens (journaled)", run.stdout)
        self.assertIn("[step 3/3] state.checkpoint -> seq", run.stdout)

    def test_resumes_after_a_crash_anywhere_without_repeating_llm_calls(self) -> None:
        baseline = self.kernel()
        expected = self.run_clean(baseline, self.argv)
        methods = [e.method for e in baseline.journal]
        first_checkpoint = methods.index("state.checkpoint") + 1
        for n, kernel, output, stdout in self.crash_everywhere(self.kernel, self.argv):
            expected["started_unix_ms"] = journaled_result(kernel, "sys.now")["unix_ms"]
            self.assertEqual(output, expected)
            self.assertEqual(len(kernel.llm_requests), 5, "an LLM call was paid twice")
            resumed = stdout.startswith("[resume]")
            self.assertEqual(resumed, n >= first_checkpoint, stdout)

    def test_ask_flag_asks_a_human_to_approve_the_summary(self) -> None:
        output = self.run_clean(self.kernel(answers=["yes"]), [*self.argv, "--ask"])
        self.assertIs(output["approved"], True)
        output = self.run_clean(self.kernel(answers=["no, redo it"]), [*self.argv, "--ask"])
        self.assertIs(output["approved"], False)

    def test_without_keel_it_says_how_to_start_it(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env["PYTHONPATH"] = str(SDK_DIR)
        run = subprocess.run(
            [sys.executable, *self.argv], env=env, capture_output=True, text=True, timeout=30
        )
        self.assertEqual(run.returncode, 2)
        self.assertIn("keel run -- python3", run.stderr)


class CrashAgentTests(DurableAgentCase):
    argv = [str(AGENTS / "crash_agent.py")]

    def kernel(self, **options: Any) -> ScriptedKernel:
        return ScriptedKernel(load_script(AGENTS / "crash_script.json"), **options)

    def test_output_is_the_twelve_replies_and_the_journaled_clock_and_random(self) -> None:
        kernel = self.kernel()
        run = kernel.run_agent(self.argv, {"CRASH_AGENT_DELAY_MS": "1"})
        self.assertEqual(run.returncode, 0, run.stderr)
        expected = {
            "replies": [f"reply {n}" for n in range(1, 13)],
            "random": journaled_result(kernel, "sys.random")["value"],
            "now": journaled_result(kernel, "sys.now")["unix_ms"],
        }
        self.assertEqual(kernel.output, expected)
        self.assertEqual(json.loads(run.stdout), expected)
        messages = [request[-1]["content"] for request in kernel.llm_requests]
        self.assertEqual(messages, [f"step {n} of 12" for n in range(1, 13)])
        checkpoint = next(e for e in kernel.journal if e.method == "state.checkpoint")
        self.assertEqual(json.loads(checkpoint.params_key)["state"]["step"], 5)

    def test_resumes_after_a_crash_anywhere(self) -> None:
        for _, kernel, output, stdout in self.crash_everywhere(self.kernel, self.argv):
            self.assertEqual(output["replies"], [f"reply {n}" for n in range(1, 13)])
            self.assertEqual(output["random"], journaled_result(kernel, "sys.random")["value"])
            self.assertEqual(output["now"], journaled_result(kernel, "sys.now")["unix_ms"])
            self.assertEqual(len(kernel.llm_requests), 12, "an LLM call was paid twice")
            self.assertEqual(json.loads(stdout), output)


class ConcurrentAgentTests(DurableAgentCase):
    argv = [str(AGENTS / "concurrent_agent.py")]
    expected = {
        "replies": sorted(f"reply thread {t} call {c}" for t in range(1, 5) for c in range(1, 4))
    }

    def kernel(self, **options: Any) -> ScriptedKernel:
        script = load_script(AGENTS / "concurrent_script.json")
        return ScriptedKernel(script, llm_delay_s=0.005, **options)

    def test_four_threads_get_their_own_replies(self) -> None:
        kernel = self.kernel()
        self.assertEqual(self.run_clean(kernel, self.argv), self.expected)
        self.assertEqual(len(kernel.llm_requests), 12)

    def test_concurrent_calls_replay_after_a_crash_anywhere(self) -> None:
        for _, kernel, output, stdout in self.crash_everywhere(self.kernel, self.argv):
            self.assertEqual(output, self.expected)
            self.assertEqual(len(kernel.llm_requests), 12, "an LLM call was paid twice")
            self.assertEqual(json.loads(stdout), self.expected)


class MemoryAgentTests(DurableAgentCase):
    argv = [str(AGENTS / "memory_agent.py")]
    expected = {
        "indexes": [0, 1, 2],
        "hits": [],  # the agent searches for topic3; three turns reach topic2
        "last2": ["turn 1: note about topic1", "turn 2: note about topic2"],
        "fit30": 2,
        "turn1": {"turn": 1},
        "deleted": True,
        "turn0": None,
    }

    def kernel(self, **options: Any) -> ScriptedKernel:
        return ScriptedKernel(**options)

    def run_memory_agent(self, kernel: ScriptedKernel) -> Any:
        return kernel.run_agent(self.argv, {"MEMORY_AGENT_TURNS": "3"})

    def test_threads_and_records_round_trip(self) -> None:
        kernel = self.kernel()
        run = self.run_memory_agent(kernel)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(kernel.output, self.expected)
        self.assertEqual([m["index"] for m in kernel.threads["chat"]], [0, 1, 2])
        self.assertEqual(sorted(k for _, k in kernel.memory), ["turn-1", "turn-2"])

    def test_resumes_after_a_crash_anywhere_without_repeating_writes(self) -> None:
        clean = self.kernel()
        self.run_memory_agent(clean)
        entries = len(clean.journal)
        for n in range(1, entries + 1):
            with self.subTest(crash_after=n):
                kernel = self.kernel(crash_after=n)
                self.assertTrue(self.run_memory_agent(kernel).crashed)
                second = self.run_memory_agent(kernel)
                self.assertEqual(second.returncode, 0, second.stderr)
                self.assertEqual(kernel.output, self.expected)
                self.assertEqual(len(kernel.threads["chat"]), 3, "an append was repeated")


class IpcAgentTests(unittest.TestCase):
    """The IPC test agent's server role against the scripted kernel: each request is
    received and answered once, across a crash anywhere."""

    argv = [str(AGENTS / "ipc_agent.py")]
    env = {"IPC_ROLE": "server", "IPC_RECV_TIMEOUT_MS": "10"}

    def kernel(self, **options: Any) -> ScriptedKernel:
        kernel = ScriptedKernel(**options)
        kernel.mailbox = [
            {"from": "run_peer", "seq": 1, "message": {"n": 0}, "correlation_id": "req-0"},
            {"from": "run_peer", "seq": 2, "message": {"n": 1}, "correlation_id": "req-1"},
            {"from": None, "seq": 3, "message": "note"},
            {"from": "run_peer", "seq": 4, "message": "stop"},
        ]
        return kernel

    expected_sent = [
        ("run_peer", {"echo": {"n": 0}}, "req-0"),
        ("run_peer", {"echo": {"n": 1}}, "req-1"),
    ]

    def test_answers_each_request_by_correlation_id(self) -> None:
        kernel = self.kernel()
        run = kernel.run_agent(self.argv, self.env)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(kernel.output, {"received": [{"n": 0}, {"n": 1}, "note", "stop"]})
        self.assertEqual(kernel.sent, self.expected_sent)

    def test_resumes_after_a_crash_anywhere_receiving_and_sending_once(self) -> None:
        clean = self.kernel()
        clean.run_agent(self.argv, self.env)
        self.assertGreaterEqual(len(clean.journal), 7)
        for n in range(1, len(clean.journal) + 1):
            with self.subTest(crash_after=n):
                kernel = self.kernel(crash_after=n)
                self.assertTrue(kernel.run_agent(self.argv, self.env).crashed)
                second = kernel.run_agent(self.argv, self.env)
                self.assertEqual(second.returncode, 0, second.stderr)
                self.assertEqual(kernel.output, {"received": [{"n": 0}, {"n": 1}, "note", "stop"]})
                self.assertEqual(kernel.sent, self.expected_sent, "a reply was lost or repeated")
                self.assertEqual(kernel.mailbox, [])


class SimpleAgentTests(unittest.TestCase):
    def test_echo_agent(self) -> None:
        kernel = ScriptedKernel()
        run = kernel.run_agent([str(AGENTS / "echo_agent.py")])
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout, "hello from agent\n")
        self.assertEqual(run.stderr, "warn\n")
        self.assertEqual(kernel.output, {"message": "hello", "n": 1})

    def test_fail_agent_exits_3_without_output(self) -> None:
        kernel = ScriptedKernel()
        run = kernel.run_agent([str(AGENTS / "fail_agent.py")])
        self.assertEqual(run.returncode, 3)
        self.assertIs(kernel.output, NO_OUTPUT)

    def test_ask_agent_exits_with_the_answer(self) -> None:
        kernel = ScriptedKernel(answers=["yes"])
        run = kernel.run_agent([str(AGENTS / "ask_agent.py")])
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(kernel.output, {"answer": "yes"})
        self.assertEqual(json.loads(run.stdout), {"answer": "yes"})

    def test_bad_client_finds_a_conforming_kernel_conforming(self) -> None:
        kernel = ScriptedKernel()
        run = kernel.run_agent([str(AGENTS / "bad_client.py")])
        summary = json.loads(run.stdout)
        self.assertEqual(summary["mismatches"], [], run.stderr)
        self.assertEqual(run.returncode, 0)
        self.assertTrue(summary["ok"])
        self.assertEqual(summary["probes"]["garbage_before_hello"]["after"], "usable")
        self.assertEqual(summary["probes"]["too_large"]["after"], "closed")
        self.assertEqual(kernel.output, {"probe": "bad_client"})


class StubbornTests(unittest.TestCase):
    def test_stubborn_tree_survives_sigterm_until_killed(self) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            pid_file = Path(scratch) / "pids"
            process = subprocess.Popen(
                [sys.executable, str(AGENTS / "stubborn.py")],
                env={**os.environ, "STUBBORN_PID_FILE": str(pid_file)},
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            try:
                assert process.stdout is not None
                self.assertEqual(process.stdout.readline(), "ready\n")
                parent, child = (int(line) for line in pid_file.read_text().split())
                self.assertEqual(parent, process.pid)
                for pid in (parent, child):
                    os.kill(pid, signal.SIGTERM)
                time.sleep(0.3)
                self.assertTrue(alive(parent) and alive(child), "SIGTERM was not ignored")
            finally:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
                process.stdout.close()
            deadline = time.monotonic() + 5
            while alive(child) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertFalse(alive(child))


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


if __name__ == "__main__":
    unittest.main()
