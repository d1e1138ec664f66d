"""The agent of `cargo bench -p keel-cli --bench cluster`'s failover case: step after step,
each a durable timer (`sys.sleep`, journaled), so that a node taking the run over replays
the steps done and then journals new ones (and the run goes from recovering to running)."""

import keel

k = keel.connect()
for step in range(1_000_000):
    k.sleep(250)
