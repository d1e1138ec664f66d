"""A mock model upstream for tests, speaking OpenAI Chat Completions
(`/v1/chat/completions`), OpenAI embeddings (`/v1/embeddings`: deterministic 32-dimension
bag-of-trigram vectors, 1 token per word) and the Anthropic Messages API (`/v1/messages`): answers from a
script (the format of Keel's scripted provider), in each provider's real wire format (JSON,
and SSE when `stream` is set), checks request invariants on every request, and counts how
many times it served each distinct request in the file named by MOCK_COUNTS (JSON,
rewritten on every request). Usage: python3 mock_upstream.py SCRIPT PORT_FILE"""

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
ANTHROPIC_KEY = os.environ.get("MOCK_EXPECT_ANTHROPIC_KEY", "sk-ant-upstream-test")


def pick(body):
    last_user = next((m.get("content") or "" for m in reversed(body["messages"]) if m["role"] == "user"), "")
    if isinstance(last_user, list):
        last_user = " ".join(p.get("text", "") for p in last_user if isinstance(p, dict) and p.get("type") == "text")
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

    def record(self, body, problems):
        key = hashlib.sha256(json.dumps({"path": self.path, **{k: body.get(k) for k in ("messages", "tools", "system")}}, sort_keys=True).encode()).hexdigest()[:16]
        with lock:
            state["counts"][key] = state["counts"].get(key, 0) + 1
            state["errors"].extend(problems)
            json.dump({"counts": state["counts"], "errors": state["errors"], "total": sum(state["counts"].values())}, open(os.environ["MOCK_COUNTS"], "w"))

    def anthropic(self, body):
        problems = []
        if self.headers.get("x-api-key") != ANTHROPIC_KEY:
            problems.append(f"anthropic key {self.headers.get('x-api-key')!r}")
        if not self.headers.get("anthropic-version"):
            problems.append("no anthropic-version header")
        if not isinstance(body.get("max_tokens"), int) or not body.get("model") or not body.get("messages"):
            problems.append("max_tokens/model/messages")
        if any(m.get("role") not in ("user", "assistant") for m in body.get("messages", [])):
            problems.append("a message role other than user/assistant")
        self.record(body, problems)
        reply = pick(body)
        if problems or reply is None:
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "; ".join(problems) or "script exhausted"}}).encode())
            return
        usage = reply.get("usage", {"input_tokens": 10, "output_tokens": 5})
        text = reply.get("content") or ""
        message = {"id": "msg_mock", "type": "message", "role": "assistant", "model": body["model"],
                   "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}}
        if not body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(message).encode())
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        def send(name, obj):
            self.wfile.write(f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()
        start = {**message, "content": [], "stop_reason": None, "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1}}
        send("message_start", {"type": "message_start", "message": start})
        send("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        for word in text.split(" "):
            send("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word + " "}})
        send("content_block_stop", {"type": "content_block_stop", "index": 0})
        send("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": usage["output_tokens"]}})
        send("message_stop", {"type": "message_stop"})

    def embeddings(self, body):
        problems = []
        if self.headers.get("authorization") != f"Bearer {KEY}":
            problems.append(f"auth {self.headers.get('authorization')!r}")
        model = body.get("model")
        if not isinstance(model, str) or not model or "/" in model:
            problems.append(f"embeddings model {model!r}")
        inputs = body.get("input")
        if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) and i for i in inputs):
            problems.append(f"embeddings input {inputs!r}: a list of non-empty strings")
            inputs = []
        with lock:
            for text in inputs:
                key = "embed:" + text
                state["counts"][key] = state["counts"].get(key, 0) + 1
            state["errors"].extend(problems)
            json.dump({"counts": state["counts"], "errors": state["errors"], "total": sum(state["counts"].values())}, open(os.environ["MOCK_COUNTS"], "w"))
        if problems:
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"error": {"message": "; ".join(problems), "type": "invalid_request_error"}}).encode())
            return

        def vector(text):
            v = [0.0] * 32
            for word in text.lower().split():
                word = f"#{word}#"
                for i in range(len(word) - 2):
                    v[int(hashlib.md5(word[i:i + 3].encode()).hexdigest(), 16) % 32] += 1.0
            return v

        data = [{"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(inputs)]
        tokens = sum(len(t.split()) for t in inputs)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode())

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", "0")))
        body = json.loads(raw)
        if self.path == "/v1/messages":
            return self.anthropic(body)
        if self.path == "/v1/embeddings":
            return self.embeddings(body)
        problems = []
        if self.path != "/v1/chat/completions":
            problems.append(f"path {self.path}")
        if self.headers.get("authorization") != f"Bearer {KEY}":
            problems.append(f"auth {self.headers.get('authorization')!r}")
        if not body.get("model") or not isinstance(body.get("messages"), list) or not body["messages"]:
            problems.append("model/messages")
        self.record(body, problems)
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
