"""Syscall round-trip client for `cargo bench -p keel-cli --bench syscall`.

Modes:
  echo PATH    raw JSON-RPC lines to an echo server at PATH (the floor)
  kernel       under `keel run`: raw-socket sys.ping round trips, then the same through the
               Python SDK; reports both through run.exit
Each mode prints one JSON object of latency stats (microseconds).
"""

import json
import os
import socket
import sys
import time

N = int(os.environ.get("BENCH_N", "20000"))
WARMUP = 1000


def stats(samples):
    samples = sorted(samples)
    n = len(samples)
    return {
        "n": n,
        "mean_us": round(sum(samples) / n, 1),
        "p50_us": round(samples[n // 2], 1),
        "p99_us": round(samples[min(n - 1, int(n * 0.99))], 1),
    }


class Lines:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""

    def call(self, obj):
        self.sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def raw_round_trips(lines):
    out = []
    for i in range(N + WARMUP):
        start = time.perf_counter()
        reply = lines.call({"jsonrpc": "2.0", "id": i + 1, "method": "sys.ping", "params": {}})
        elapsed = (time.perf_counter() - start) * 1e6
        if reply.get("id") != i + 1:
            raise RuntimeError(f"bad reply {reply}")
        if i >= WARMUP:
            out.append(elapsed)
    return stats(out)


def main():
    mode = sys.argv[1]
    if mode == "echo":
        print(json.dumps({"echo": raw_round_trips(Lines(sys.argv[2]))}))
        return
    lines = Lines(os.environ["KEEL_SOCKET"])
    hello = lines.call({"jsonrpc": "2.0", "id": 0, "method": "hello", "params": {"token": os.environ["KEEL_RUN_TOKEN"]}})
    assert "result" in hello, hello
    raw = raw_round_trips(lines)

    import keel

    client = keel.connect()
    samples = []
    for i in range(N + WARMUP):
        start = time.perf_counter()
        client.ping()
        elapsed = (time.perf_counter() - start) * 1e6
        if i >= WARMUP:
            samples.append(elapsed)
    result = {"kernel_raw": raw, "kernel_sdk": stats(samples)}
    client.exit(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
