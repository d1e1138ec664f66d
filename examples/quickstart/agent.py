"""Keel quickstart: a small research assistant that survives crashes.

It plans three research steps with the LLM, works through them (one LLM call and one
saved note each), checkpoints after every step, optionally asks a human to approve the
summary, and exits with a JSON report. Every line it prints names the syscall behind it,
so you can watch the kernel at work:

    keel run --llm-script examples/quickstart/script.json -- python3 examples/quickstart/agent.py

Kill the kernel half-way and start it again: the agent is restarted, `state.restore`
hands back the last checkpoint, finished steps are skipped, and the calls made after the
checkpoint are answered from the journal, so no LLM call is paid for twice. For that to
work the program is deterministic given its syscall results: time comes from `sys.now`,
never from `time`, and nothing depends on the order threads happen to run in.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import keel

STEPS = 3
SYSTEM = {"role": "system", "content": "You are a careful research assistant. Be brief."}


def say(stage: str, text: str) -> None:
    print(f"[{stage}] {text}", flush=True)


def chat(k: keel.Client, stage: str, prompt: str, state: dict[str, Any]) -> str:
    """One LLM call; its tokens are added to the state's running total."""
    reply = k.llm_chat([SYSTEM, {"role": "user", "content": prompt}], max_tokens=400)
    usage = reply["usage"]
    tokens = usage["input_tokens"] + usage["output_tokens"]
    state["tokens"] += tokens
    say(stage, f"llm.chat -> {tokens} tokens (journaled)")
    return str(reply["message"]["content"] or "")


def parse_plan(text: str) -> list[str]:
    """The numbered lines of the LLM's plan ("1. Survey: ...") without their numbers."""
    steps = []
    for line in text.splitlines():
        number, dot, title = line.strip().partition(". ")
        if dot and number.isdigit():
            steps.append(title.strip())
    if len(steps) < STEPS:
        raise SystemExit(f"the LLM's plan has {len(steps)} steps, {STEPS} expected:\n{text}")
    return steps[:STEPS]


def show_plan(plan: list[str], note: str = "") -> None:
    for number, title in enumerate(plan, start=1):
        say("plan", f"{number}. {title}{note}")


def research(k: keel.Client, topic: str, ask_human: bool) -> dict[str, Any]:
    state = k.restore()
    if state is None:
        state = {
            "topic": topic,
            "started_unix_ms": k.now_ms(),
            "plan": None,  # the step titles, once planned
            "done": 0,  # steps finished (their notes are saved in the kv store)
            "tokens": 0,  # tokens of all LLM calls so far
        }
        say("start", f"run {k.run_id}: fresh start, topic {topic!r}")
    else:
        say("resume", f"state.restore -> {state['done']}/{STEPS} steps done; skipping them")
    topic = state["topic"]

    if state["plan"] is None:
        prompt = f"[plan] Plan research on: {topic}. Reply with {STEPS} numbered steps."
        state["plan"] = parse_plan(chat(k, "plan", prompt, state))
        show_plan(state["plan"])
        say("plan", f"state.checkpoint -> seq {k.checkpoint(state)}")
    else:
        show_plan(state["plan"], " (from the checkpoint)")

    for number in range(state["done"] + 1, STEPS + 1):
        stage = f"step {number}/{STEPS}"
        title = state["plan"][number - 1]
        say(stage, title)
        prompt = f"[step {number}/{STEPS}] {title}\nTopic: {topic}. Give one finding."
        note = {"title": title, "finding": chat(k, stage, prompt, state)}
        saved = k.tool("kv.put", key=f"notes/step-{number}", value=note)
        say(stage, f"tool.call kv.put notes/step-{number} -> {json.dumps(saved)}")
        state["done"] = number
        say(stage, f"state.checkpoint -> seq {k.checkpoint(state)}")

    notes = [k.tool("kv.get", key=f"notes/step-{n}") for n in range(1, STEPS + 1)]
    say("summary", f"tool.call kv.get x{STEPS} -> {len(notes)} notes read back")
    findings = "\n".join(f"- {note['title']}: {note['finding']}" for note in notes)
    summary = chat(k, "summary", f"[summary] Summarise the findings on {topic}:\n{findings}", state)
    say("summary", summary)

    approved = None
    if ask_human:
        say("ask", f"human.ask: waiting for `keel answer {k.run_id} --text yes` (or no)")
        answer = k.ask(f"Approve this summary of {topic!r}?\n\n{summary}\n\nAnswer yes or no.")
        approved = answer.strip().lower() in ("y", "yes", "ok", "approve", "approved")
        say("ask", f"human.ask -> {answer!r} ({'approved' if approved else 'not approved'})")

    return {
        "topic": topic,
        "summary": summary,
        "steps": [{"step": n, **note} for n, note in enumerate(notes, start=1)],
        "total_tokens": state["tokens"],
        "started_unix_ms": state["started_unix_ms"],
        "approved": approved,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", default="how agent runtimes survive crashes")
    parser.add_argument("--ask", action="store_true", help="ask a human to approve the summary")
    args = parser.parse_args()
    try:
        with keel.connect() as k:
            output = research(k, args.topic, args.ask)
            k.exit(output)
            steps, tokens = len(output["steps"]), output["total_tokens"]
            say("exit", f"run.exit -> {steps} steps, {tokens} tokens in all")
    except keel.NotUnderKeel as err:
        print(err, file=sys.stderr)
        return 2
    except (keel.KeelError, keel.ConnectionLost) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
