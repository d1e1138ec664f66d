"""A supervisor agent: spawns three workers as child runs, hands each a task by message,
gathers their results, waits for them to end, and reports.

    keel run --llm-script examples/team/script.json -- python3 examples/team/supervisor.py

Every step is a journaled syscall: kill the kernel at any point and `keel serve` brings
the whole tree back (the spawns and waits replay; no LLM call is paid twice).
"""

import os
import sys

import keel

WORKER = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "worker.py")

with keel.connect() as k:
    state = k.restore() or {}
    workers = state.get("workers")
    if not workers:
        workers = [k.spawn(["python3", WORKER], input={"name": f"worker-{i + 1}"}) for i in range(3)]
        k.checkpoint({"workers": workers})
        print(f"spawned {len(workers)} workers: {', '.join(workers)}", flush=True)

    plan = k.llm_chat([{"role": "user", "content": "[plan] Split 'why agents need a kernel' into 3 parts"}])
    tasks = [line.strip() for line in plan["message"]["content"].splitlines() if line.strip()][:3]
    for worker, task in zip(workers, tasks):
        k.send(worker, {"task": task}, correlation_id=worker)

    results = {}
    while len(results) < len(workers):
        message = k.recv()
        results[message["from"]] = message["message"]["result"]
        print(f"result from {message['from']}: {message['message']['result']}", flush=True)
    for worker in workers:
        done = k.wait(worker)
        assert done["state"] == "succeeded", done

    notes = "\n".join(results[w] for w in workers)
    summary = k.llm_chat([{"role": "user", "content": f"[summary] Combine:\n{notes}"}])
    report = {"workers": workers, "results": [results[w] for w in workers],
              "summary": summary["message"]["content"]}
    print(report["summary"], flush=True)
    k.exit(report)
