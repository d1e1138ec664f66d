"""Fires 20 LLM calls at once from 20 threads (distinct requests), so the budget must hold
under concurrency. Exits with the replies it got."""

import threading

import keel

k = keel.connect()
replies = [None] * 20


def call(i):
    reply = k.llm_chat([{"role": "user", "content": f"question {i}"}], max_tokens=100)
    replies[i] = reply["message"]["content"]


threads = [threading.Thread(target=call, args=(i,)) for i in range(20)]
for t in threads:
    t.start()
for t in threads:
    t.join()
k.exit({"replies": sum(r is not None for r in replies)})
