"""Agent for `cargo bench -p keel-cli --bench exec`.

Modes (argv[1]):
  latency   code.exec of a program making 10 governed tool calls, in each language;
            reports latency stats (microseconds) through run.exit
  loop      a 10-step task as 10 LLM tool-call round trips (the scripted provider)
  exec      the same task as one LLM call that writes a program, one code.exec, and
            one LLM call with its result
"""

import json
import os
import sys
import time

import keel

N = int(os.environ.get("BENCH_N", "300"))
N_CPYTHON = int(os.environ.get("BENCH_N_CPYTHON", "30"))
PROGRAMS = {
    "python": "total = 0\nfor i in range(10):\n    total = total + echo(n=i)['n']\ntotal",
    "javascript": "let total = 0; for (let i = 0; i < 10; i++) { total += echo({n: i}).n; } total",
    "cpython": "total = 0\nfor i in range(10):\n    total = total + echo(n=i)['n']\ntotal",
}
DOCS = [f"document {i}: " + " ".join(["lorem"] * (20 + i)) for i in range(10)]


def stats(samples):
    samples = sorted(samples)
    n = len(samples)
    return {
        "n": n,
        "p50_us": round(samples[n // 2], 1),
        "p99_us": round(samples[min(n - 1, int(n * 0.99))], 1),
        "mean_us": round(sum(samples) / n, 1),
    }


def latency(k):
    out = {}
    for lang, code in PROGRAMS.items():
        n = N_CPYTHON if lang == "cpython" else N
        outer, inner = [], []
        for i in range(n + 5):
            start = time.perf_counter()
            result = k.exec(code, lang=lang)
            took = (time.perf_counter() - start) * 1e6
            assert result["result"] == 45, result
            assert len(result["tool_calls"]) == 10, result
            if i >= 5:
                outer.append(took)
                inner.append(result["duration_us"])
        out[lang] = {"agent": stats(outer), "kernel": stats(inner)}
    return out


TOOLS = [{
    "type": "function",
    "function": {
        "name": "word_count",
        "description": "Counts the words of document i (0-9).",
        "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]},
    },
}]
TASK = "What is the total number of words in documents 0 to 9? Use the tools."


def loop(k):
    messages = [{"role": "user", "content": TASK}]
    while True:
        reply = k.llm_chat(messages, tools=TOOLS)
        message = reply["message"]
        messages.append({k2: v for k2, v in message.items() if v is not None})
        calls = message.get("tool_calls") or []
        if not calls:
            return message.get("content")
        for call in calls:
            args = json.loads(call["function"]["arguments"])
            count = len(k.tool("echo", text=DOCS[args["i"]])["text"].split())
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(count)})


def exec_once(k):
    messages = [{"role": "user", "content": TASK + " Write one Python program."}]
    reply = k.llm_chat(messages)
    code = reply["message"]["content"]
    messages.append({"role": "assistant", "content": code})
    result = k.exec(code, inputs={"docs": DOCS})
    messages.append({"role": "user", "content": f"The program returned {json.dumps(result['result'])}."})
    return k.llm_chat(messages)["message"]["content"]


with keel.connect() as k:
    mode = sys.argv[1]
    if mode == "latency":
        k.exit(latency(k))
    elif mode == "loop":
        k.exit({"answer": loop(k)})
    else:
        k.exit({"answer": exec_once(k)})
