"""Agent of `cargo bench -p keel-cli --bench llmsched`: THREADS threads each make CALLS
LLM calls (distinct requests) back to back; exits with each call's latency (ms) and when
each finished (Unix ms)."""

import os
import threading
import time

import keel

plan = keel.input({})
threads, calls, tag = plan["threads"], plan["calls"], plan["tag"]
latencies, finished = [], []
lock = threading.Lock()

with keel.connect() as k:
    def worker(t):
        for i in range(calls):
            start = time.perf_counter()
            k.llm_chat([{"role": "user", "content": f"{tag} thread {t} call {i}"}], max_tokens=1)
            took = (time.perf_counter() - start) * 1000
            with lock:
                latencies.append(took)
                finished.append(int(time.time() * 1000))

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    k.exit({"latencies_ms": latencies, "finished_ms": finished})
