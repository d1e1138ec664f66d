"""Test agent for a failing run: connects, then exits with status 3 without `run.exit`.

The kernel should mark the run failed and report exit status 3. Prints
"fail_agent: exiting with status 3" on stderr.
"""

from __future__ import annotations

import sys

import keel

with keel.connect():
    pass
print("fail_agent: exiting with status 3", file=sys.stderr, flush=True)
sys.exit(3)
