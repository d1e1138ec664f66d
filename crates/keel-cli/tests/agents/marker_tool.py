"""A command tool for the tests: JSON on stdin, JSON on stdout.

Appends the call's idempotency key to the file named by $MARKER (so tests count how
often the effect happened), sleeps `args.sleep_ms` unless the key was seen before (a
retry), and answers how many lines the file has. With `args.fail`, exits 3 after writing to stderr.
"""

import json
import os
import sys
import time

request = json.load(sys.stdin)
args = request.get("args", {})
key = request.get("idempotency_key")
assert key == os.environ.get("KEEL_IDEMPOTENCY_KEY"), (key, os.environ.get("KEEL_IDEMPOTENCY_KEY"))
try:
    with open(os.environ["MARKER"]) as marker:
        retried = key in marker.read().splitlines()
except FileNotFoundError:
    retried = False
with open(os.environ["MARKER"], "a") as marker:
    marker.write(f"{key}\n")
    marker.flush()
    os.fsync(marker.fileno())
# A retry with a key seen before finishes at once (the tests kill the first attempt).
if not retried:
    time.sleep(args.get("sleep_ms", 0) / 1000)
if args.get("fail"):
    print("the tool was asked to fail", file=sys.stderr)
    sys.exit(3)
with open(os.environ["MARKER"]) as marker:
    lines = marker.read().splitlines()
print(json.dumps({"key": key, "lines": len(lines), "text": args.get("text", "")}))
