"""Test agent for replaying concurrent calls: four threads, three LLM calls each, at once.

Run with `--llm-script concurrent_script.json`. Calls `state.restore` first (it never
checkpoints, so the state is null and a recovery replays every call). Then threads 1..4
start together; thread T sends the user messages "thread T call 1".."thread T call 3" in
order, over one shared connection, so the kernel sees up to four calls in flight and
the order between threads differs from run to run. Replay matches calls by (method,
params) and occurrence, not by arrival order, so a recovered run must still get each
thread its own replies. Exits via `run.exit` with {"replies": [the 12 reply contents,
sorted]} ("reply thread 1 call 1".."reply thread 4 call 3") and prints that as one JSON
line on stdout.
"""

from __future__ import annotations

import json
import sys
import threading

import keel

THREADS = 4
CALLS_PER_THREAD = 3


def main() -> int:
    with keel.connect() as k:
        state = k.restore()
        print(f"concurrent_agent: restored state {state!r}", file=sys.stderr, flush=True)
        start_together = threading.Barrier(THREADS)
        replies: list[str] = []
        failures: list[BaseException] = []
        lock = threading.Lock()

        def worker(thread: int) -> None:
            try:
                start_together.wait()
                for call in range(1, CALLS_PER_THREAD + 1):
                    message = {"role": "user", "content": f"thread {thread} call {call}"}
                    reply = k.llm_chat([message])
                    with lock:
                        replies.append(reply["message"]["content"])
            except BaseException as err:  # re-raised on the main thread
                with lock:
                    failures.append(err)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(1, THREADS + 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]

        output = {"replies": sorted(replies)}
        k.exit(output)
    print(json.dumps(output), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
