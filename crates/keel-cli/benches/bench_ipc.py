"""IPC agents and floors for `cargo bench -p keel-cli --bench ipc`.

Modes (each prints one JSON object of results on stdout, or passes it to run.exit):
  echo-serve PATH   floor server: a Unix-socket line server; echoes `req` lines, counts
                    `one` lines, answers `flush` with the count
  echo-client PATH  floor client: request/reply round trips, then one-way throughput
  sqlite PATH       floor store: one INSERT and one fsync'd commit (WAL, synchronous=FULL)
                    per message
  server            under `keel run`: the same protocol over ipc.recv / ipc.send (after a
                    `batch` message, ipc.recv with `max`: whatever waits in one step; after
                    `combined`, a reply and the next receive as one ipc.send with `recv`)
  client            under `keel run`: the same measurements against run BENCH_PEER
"""

import json
import os
import socket
import sqlite3
import sys
import threading
import time

N = int(os.environ.get("BENCH_N", "2000"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "200"))
ONEWAY = int(os.environ.get("BENCH_ONEWAY", "5000"))
SENDERS = int(os.environ.get("BENCH_SENDERS", "16"))
RECV_MAX = int(os.environ.get("BENCH_RECV_MAX", "100"))


def stats(samples):
    samples = sorted(samples)
    n = len(samples)
    return {
        "n": n,
        "mean_us": round(sum(samples) / n, 1),
        "p50_us": round(samples[n // 2], 1),
        "p99_us": round(samples[min(n - 1, int(n * 0.99))], 1),
        "per_s": round(n / (sum(samples) / 1e6)),
    }


def throughput(count, seconds):
    return {"n": count, "seconds": round(seconds, 3), "per_s": round(count / seconds)}


class Lines:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def send(self, obj):
        self.sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def read(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def echo_serve(path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    print("ready", flush=True)
    conn, _ = listener.accept()
    lines = Lines(conn)
    count = 0
    while True:
        msg = lines.read()
        if msg is None:
            return
        op = msg["op"]
        if op == "req":
            lines.send(msg)
        elif op == "one":
            count += 1
        elif op == "flush":
            lines.send({"count": count})
            count = 0


def echo_client(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    lines = Lines(sock)
    samples = []
    for i in range(WARMUP + N):
        start = time.perf_counter()
        lines.send({"op": "req", "i": i})
        reply = lines.read()
        elapsed = (time.perf_counter() - start) * 1e6
        assert reply["i"] == i, reply
        if i >= WARMUP:
            samples.append(elapsed)
    start = time.perf_counter()
    for i in range(ONEWAY):
        lines.send({"op": "one", "i": i})
    lines.send({"op": "flush"})
    reply = lines.read()
    assert reply["count"] == ONEWAY, reply
    oneway = throughput(ONEWAY, time.perf_counter() - start)
    print(json.dumps({"round_trip": stats(samples), "oneway": oneway}))


def sqlite_floor(path):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
    samples = []
    for i in range(WARMUP + N):
        body = json.dumps({"op": "req", "i": i})
        start = time.perf_counter()
        db.execute("BEGIN")
        db.execute("INSERT INTO m (body) VALUES (?)", (body,))
        db.execute("COMMIT")
        elapsed = (time.perf_counter() - start) * 1e6
        if i >= WARMUP:
            samples.append(elapsed)
    print(json.dumps({"commit": stats(samples)}))


def server():
    import keel

    k = keel.connect()
    count = 0
    batch = 0  # after a `batch` message: receive up to this many at once (recv_many)
    combined = False  # after `combined`: answer a request and receive the next in one call
    received = []
    while True:
        if not received:
            received = k.recv_many(batch) if batch else [k.recv()]
        while received:
            msg = received.pop(0)
            body = msg["message"]
            op = body["op"]
            if op == "req" and combined and not received:
                received = [k.send_recv(msg["from"], body, correlation_id=msg["correlation_id"])]
            elif op == "req":
                k.send(msg["from"], body, correlation_id=msg["correlation_id"])
            elif op == "combined":
                combined = body["on"]
            elif op == "one":
                count += 1
            elif op == "flush":
                k.send(msg["from"], {"count": count}, correlation_id=msg["correlation_id"])
                count = 0
            elif op == "batch":
                batch = body["max"]
            elif op == "stop":
                k.exit({"ok": True})
                return


def client():
    import keel

    peer = os.environ["BENCH_PEER"]
    k = keel.connect()
    samples = []
    for i in range(WARMUP + N):
        start = time.perf_counter()
        k.send(peer, {"op": "req", "i": i}, correlation_id=f"r{i}")
        reply = k.recv()
        elapsed = (time.perf_counter() - start) * 1e6
        assert reply["correlation_id"] == f"r{i}", reply
        if i >= WARMUP:
            samples.append(elapsed)
    result = {"round_trip": stats(samples)}

    # The same round trips with `send_recv` on both sides: each side's send and its next
    # receive in one call.
    k.send(peer, {"op": "combined", "on": True})
    samples = []
    for i in range(WARMUP + N):
        start = time.perf_counter()
        reply = k.send_recv(peer, {"op": "req", "i": i}, correlation_id=f"c{i}")
        elapsed = (time.perf_counter() - start) * 1e6
        assert reply["correlation_id"] == f"c{i}", reply
        if i >= WARMUP:
            samples.append(elapsed)
    result["round_trip_combined"] = stats(samples)
    k.send(peer, {"op": "combined", "on": False})

    def oneway(senders, tag):
        per_sender = ONEWAY // senders

        def send_many(s):
            for i in range(per_sender):
                k.send(peer, {"op": "one", "s": s, "i": i})

        start = time.perf_counter()
        threads = [threading.Thread(target=send_many, args=(s,)) for s in range(senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        k.send(peer, {"op": "flush"}, correlation_id=tag)
        reply = k.recv()
        assert reply["correlation_id"] == tag and reply["message"]["count"] == per_sender * senders, reply
        return throughput(per_sender * senders, time.perf_counter() - start)

    result["oneway_1"] = oneway(1, "flush1")
    result["oneway_many"] = oneway(SENDERS, "flushmany")
    # The same senders to a receiver that takes whatever waits, up to 100, in one step.
    k.send(peer, {"op": "batch", "max": RECV_MAX})
    result["oneway_many_batched"] = oneway(SENDERS, "flushbatched")
    result["recv_max"] = RECV_MAX
    result["senders"] = SENDERS
    k.send(peer, {"op": "stop"})
    k.exit(result)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "echo-serve":
        echo_serve(sys.argv[2])
    elif mode == "echo-client":
        echo_client(sys.argv[2])
    elif mode == "sqlite":
        sqlite_floor(sys.argv[2])
    elif mode == "server":
        server()
    elif mode == "client":
        client()
