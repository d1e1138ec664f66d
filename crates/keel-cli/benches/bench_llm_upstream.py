"""A fast OpenAI-compatible upstream for `cargo bench -p keel-cli --bench llmsched` and
`scripts/bench-gateway-instructions`: answers every chat completion at once (the kernel's
rate limiter, or the gateway's own work, is what they measure).
Usage: bench_llm_upstream.py PORT_FILE"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        request = json.loads(self.rfile.read(length) or b"{}")
        body = json.dumps({
            "id": "chatcmpl-bench", "object": "chat.completion", "created": 0,
            "model": request.get("model", "m"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
        }).encode()
        # Headers and body in one write: written apart (as send_response and end_headers
        # do), the body waits for the client's delayed ACK of the headers, 40 ms a call.
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        self.wfile.write(head + body)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(sys.argv[1], "w") as f:
    f.write(str(server.server_address[1]))
server.serve_forever()
