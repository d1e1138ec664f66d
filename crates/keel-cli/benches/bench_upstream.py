"""A slow OpenAI-compatible upstream for `cargo bench -p keel-cli --bench stop`: every
streamed chat completion sends one SSE chunk every 50 ms for 60 s. It watches each
connection for the client closing it (EOF or reset, checked between chunks with select, so
a close is seen within microseconds, not at the next write) and records when, in Unix
nanoseconds, and whether the client closed it (`by_client`) or the upstream ended it.
`GET /state` answers {"streams": [{"tag", "opened_ns", "closed_ns", "by_client"}...]}; `tag`
is the request's last message.
Usage: python3 bench_upstream.py PORT_FILE"""

import json
import os
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
streams = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        with lock:
            body = json.dumps({"streams": streams}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        tag = (request.get("messages") or [{}])[-1].get("content")
        record = {"tag": tag, "opened_ns": time.time_ns(), "closed_ns": None, "by_client": False}
        with lock:
            streams.append(record)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self.wfile.flush()
        sock = self.connection
        base = {"id": "chatcmpl-slow", "object": "chat.completion.chunk", "created": 1700000000, "model": request.get("model")}
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                readable, _, _ = select.select([sock], [], [], 0.05)
                if readable and not sock.recv(1, socket.MSG_PEEK):
                    record["by_client"] = True
                    break
                chunk = {**base, "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}]}
                sock.sendall(f"data: {json.dumps(chunk)}\n\n".encode())
        except OSError:
            record["by_client"] = True
        record["closed_ns"] = time.time_ns()
        self.close_connection = True


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
server.serve_forever()
