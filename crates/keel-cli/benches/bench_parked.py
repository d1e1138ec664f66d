"""The parked agent of `cargo bench -p keel-cli --bench parked`: waits on ipc.recv (and is
swapped out meanwhile), then finishes with the message it got."""

import keel

k = keel.connect()
msg = k.recv()
k.exit({"got": msg["message"]})
