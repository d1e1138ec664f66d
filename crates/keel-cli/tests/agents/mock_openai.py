"""A mock OpenAI Chat Completions upstream for tests: answers from a script (the same
format as Keel's scripted provider), speaks the real wire format (JSON, and SSE when
`stream` is set), checks request invariants on every request, and counts how many times it
served each distinct request body in the file named by MOCK_COUNTS (JSON, rewritten on
every request). Usage: python3 mock_openai.py SCRIPT PORT_FILE"""

import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

script = json.load(open(sys.argv[1]))["responses"]
ordered = [r for r in script if "match" not in r]
lock = threading.Lock()
state = {"cursor": 0, "counts": {}, "errors": []}
KEY = os.environ.get("MOCK_EXPECT_KEY", "sk-upstream-test")


def pick(body):
    last_user = next((m.get("content") or "" for m in reversed(body["messages"]) if m["role"] == "user"), "")
    if isinstance(last_user, list):
        last_user = " ".join(p.get("text", "") for p in last_user if isinstance(p, dict))
    for r in script:
        if "match" in r and r["match"] in last_user:
            return r
    with lock:
        if state["cursor"] >= len(ordered):
            return None
        r = ordered[state["cursor"]]
        state["cursor"] += 1
        return r


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", "0")))
        body = json.loads(raw)
        problems = []
        if self.path != "/v1/chat/completions":
            problems.append(f"path {self.path}")
        if self.headers.get("authorization") != f"Bearer {KEY}":
            problems.append(f"auth {self.headers.get('authorization')!r}")
        if not body.get("model") or not isinstance(body.get("messages"), list) or not body["messages"]:
            problems.append("model/messages")
        key = hashlib.sha256(json.dumps({k: body[k] for k in ("messages", "tools") if k in body}, sort_keys=True).encode()).hexdigest()[:16]
        with lock:
            state["counts"][key] = state["counts"].get(key, 0) + 1
            state["errors"].extend(problems)
            json.dump({"counts": state["counts"], "errors": state["errors"], "total": sum(state["counts"].values())}, open(os.environ["MOCK_COUNTS"], "w"))
        reply = pick(body)
        if problems or reply is None:
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"error": {"message": "; ".join(problems) or "script exhausted", "type": "invalid_request_error"}}).encode())
            return
        usage = reply.get("usage", {"input_tokens": 10, "output_tokens": 5})
        message = {"role": "assistant", "content": reply.get("content")}
        if reply.get("tool_calls"):
            message["tool_calls"] = reply["tool_calls"]
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        u = {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"], "total_tokens": usage["input_tokens"] + usage["output_tokens"]}
        base = {"id": "chatcmpl-mock", "created": 1700000000, "model": body["model"]}
        if not body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({**base, "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": u}).encode())
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        def send(obj):
            self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()
        chunk = {**base, "object": "chat.completion.chunk"}
        if message["content"]:
            for word in message["content"].split(" "):
                send({**chunk, "choices": [{"index": 0, "delta": {"content": word + " "}, "finish_reason": None}]})
        for i, call in enumerate(message.get("tool_calls") or []):
            send({**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]}, "finish_reason": None}]})
        send({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            send({**chunk, "choices": [], "usage": u})
        self.wfile.write(b"data: [DONE]\n\n")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
server.serve_forever()
