"""Tracing overhead client for `cargo bench -p keel-cli --bench otel`, run as an agent
under `keel serve` (with and without an OTLP exporter). Measures, in microseconds:
  ping      sys.ping on the raw socket (not journaled: no span either way; the control)
  now       sys.now on the raw socket (journaled: one span each when tracing)
  gateway   POST /v1/chat/completions through the kernel's gateway (an llm.chat of the
            run, answered by the scripted provider: one span and two metric points each)
Reports them through run.exit and prints them.
"""

import http.client
import json
import os
import time
import urllib.parse

from bench_client import Lines, stats

N = int(os.environ.get("BENCH_N", "2000"))
WARMUP = 200


def timed(n, call):
    out = []
    for i in range(n + WARMUP):
        start = time.perf_counter()
        call(i)
        elapsed = (time.perf_counter() - start) * 1e6
        if i >= WARMUP:
            out.append(elapsed)
    return stats(out)


def main():
    lines = Lines(os.environ["KEEL_SOCKET"])
    hello = lines.call({"jsonrpc": "2.0", "id": 0, "method": "hello", "params": {"token": os.environ["KEEL_RUN_TOKEN"]}})
    assert "result" in hello, hello

    def rpc(method):
        def call(i):
            reply = lines.call({"jsonrpc": "2.0", "id": i + 1, "method": method, "params": {}})
            assert "result" in reply, reply
        return call

    base = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
    conn = http.client.HTTPConnection(base.hostname, base.port)
    headers = {"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}

    def chat(i):
        body = json.dumps({"model": "bench-model", "messages": [{"role": "user", "content": f"bench {i}"}]})
        conn.request("POST", base.path + "/chat/completions", body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        assert response.status == 200, data

    result = {"ping": timed(N, rpc("sys.ping")), "now": timed(N, rpc("sys.now")), "gateway": timed(N, chat)}
    lines.call({"jsonrpc": "2.0", "id": 10**9, "method": "run.exit", "params": {"output": result}})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
