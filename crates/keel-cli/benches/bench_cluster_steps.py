"""The agent of `cargo bench -p keel-cli --bench cluster`'s throughput case: journaled
steps back to back (`sys.now`, whose result is journaled), until the run is stopped."""

import keel

k = keel.connect()
while True:
    k.now_ms()
