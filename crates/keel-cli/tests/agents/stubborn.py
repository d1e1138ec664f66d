"""Test agent for `keel stop`: a process tree that ignores SIGTERM and never exits.

Proves that stopping a run escalates from the graceful signal to a kill after the grace
period, and that the kill reaches the whole tree, not just the process Keel started.

- Ignores SIGTERM, then forks a child that inherits that and sleeps forever.
- Writes both pids, the parent's then the child's, one per line, to the file named by
  env `STUBBORN_PID_FILE` (written to a temporary name and renamed, so a reader never
  sees half of it; skipped if the variable is unset).
- Then prints "ready" on stdout and sleeps forever. It never connects to the kernel.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def sleep_forever() -> None:
    while True:
        time.sleep(3600)


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child across fork
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        sleep_forever()

    pid_file = os.environ.get("STUBBORN_PID_FILE")
    if pid_file:
        partial = f"{pid_file}.partial"
        with open(partial, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n{child}\n")
        os.replace(partial, pid_file)
    print("ready", flush=True)
    sleep_forever()


if __name__ == "__main__":
    main()
