"""A listing's cost: 1,000 live runs of tier `none` in a fresh daemon, then 40
`GET /v1/runs?limit=2000` in a row; prints the p50 and the daemon's CPU per listing
(read from /proc). Run it with each of two `keel` binaries, alternately, to compare.
With PATH, that path is asked instead of the listing (`/metrics`, say), over the same
1,000 live runs.

    python3 crates/keel-cli/benches/listing.py target/release/keel [RUNS] [LISTINGS] [PATH]
"""

import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

keel = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
listings = int(sys.argv[3]) if len(sys.argv) > 3 else 40
data = tempfile.mkdtemp(prefix="keel-listing-")
env = dict(os.environ, KEEL_DATA_DIR=data)
for name in ("KEEL_ADDR", "KEEL_LLM_SCRIPT", "KEEL_STORE_URL"):
    env.pop(name, None)
daemon = subprocess.Popen(
    [keel, "serve", "--listen", "127.0.0.1:0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
)
try:
    while not os.path.exists(f"{data}/kernel.json"):
        time.sleep(0.02)
    time.sleep(0.2)
    base = "http://" + json.load(open(f"{data}/kernel.json"))["addr"]
    token = open(f"{data}/api-token").read().strip()

    def call(method, path, body=None):
        request = urllib.request.Request(
            base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request) as response:
            return response.read()

    run = {"command": ["sleep", "3600"], "cwd": "/tmp", "sandbox": {"tier": "none"}}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: call("POST", "/v1/runs", run), range(runs)))
    listing = f"/v1/runs?limit={runs * 2}"
    asked = sys.argv[4] if len(sys.argv) > 4 else listing
    while sum(r["state"] == "running" for r in json.loads(call("GET", listing))) < runs:
        time.sleep(0.2)

    def cpu_secs():
        fields = open(f"/proc/{daemon.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before = cpu_secs()
    took = []
    for _ in range(listings):
        started = time.perf_counter()
        call("GET", asked)
        took.append(time.perf_counter() - started)
    cpu = (cpu_secs() - before) / listings
    print(f"GET {asked} with {runs} live runs: p50 {statistics.median(took) * 1e3:.1f} ms, daemon CPU per request {cpu * 1e3:.1f} ms")
finally:
    # The agents die with the daemon (PR_SET_PDEATHSIG).
    daemon.kill()
    daemon.wait()
