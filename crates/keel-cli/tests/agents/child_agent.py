"""Test agent called as a tool: exits with its input's `text` upper-cased."""

import keel

args = keel.input({})
with keel.connect() as k:
    k.exit({"summary": str(args.get("text", "")).upper(), "child_of": k.run_id})
