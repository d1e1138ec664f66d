"""A mock model upstream for tests, speaking OpenAI Chat Completions
(`/v1/chat/completions`), the OpenAI Responses API (`/v1/responses`: stateless requests,
a reasoning item with encrypted content in every answer, which may only come back
unchanged), OpenAI embeddings (`/v1/embeddings`: deterministic 32-dimension
bag-of-trigram vectors, 1 token per word) and the Anthropic Messages API (`/v1/messages`): answers from a
script (the format of Keel's scripted provider), in each provider's real wire format (JSON,
and SSE when `stream` is set), checks request invariants on every request, and counts how
many times it served each distinct request in the file named by MOCK_COUNTS (JSON,
rewritten on every request; `paths` counts requests by path). Usage: python3 mock_upstream.py SCRIPT PORT_FILE"""

import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

script = json.load(open(sys.argv[1]))["responses"]
ordered = [r for r in script if "match" not in r and "echo" not in r]
lock = threading.Lock()
state = {"cursor": 0, "counts": {}, "errors": [], "paths": {}, "reasoning": [], "repeated": {}}
KEY = os.environ.get("MOCK_EXPECT_KEY", "sk-upstream-test")
ANTHROPIC_KEY = os.environ.get("MOCK_EXPECT_ANTHROPIC_KEY", "sk-ant-upstream-test")


def pick(body):
    # Chat and Anthropic send `messages`; the Responses API sends `input` items.
    turns = body.get("messages") or [i for i in body.get("input") or [] if i.get("type", "message") == "message"]
    last_user = next((m.get("content") or "" for m in reversed(turns) if m.get("role") == "user"), "")
    if isinstance(last_user, list):
        last_user = " ".join(p.get("text", "") for p in last_user if isinstance(p, dict) and p.get("type") in ("text", "input_text"))
    for r in script:
        if "match" in r and r["match"] in last_user:
            return r
        # {"echo": PREFIX} answers every request with PREFIX + the last user message
        # (many runs at once, each with its own prompts).
        if "echo" in r:
            return {**r, "content": r["echo"] + last_user}
    with lock:
        if state["cursor"] >= len(ordered):
            return None
        r = ordered[state["cursor"]]
        state["cursor"] += 1
        return r


def dump():
    """Writes the counts file; the caller holds `lock`."""
    json.dump({"counts": state["counts"], "errors": state["errors"], "paths": state["paths"], "repeated": state["repeated"],
               "total": sum(state["counts"].values())}, open(os.environ["MOCK_COUNTS"], "w"))


def check_responses(body, headers):
    """The Responses API's request invariants; returns the problems found."""
    problems = []
    if headers.get("authorization") != f"Bearer {KEY}":
        problems.append(f"auth {headers.get('authorization')!r}")
    model = body.get("model")
    if not isinstance(model, str) or not model or "/" in model:
        problems.append(f"responses model {model!r}")
    for chat_only in ("messages", "max_tokens", "max_completion_tokens", "stream_options", "response_format", "stop"):
        if chat_only in body:
            problems.append(f"Chat Completions field {chat_only!r} in a Responses request")
    limit = body.get("max_output_tokens")
    if not isinstance(limit, int) or limit <= 0:
        problems.append(f"max_output_tokens {limit!r}")
    if body.get("store") is not False:
        problems.append(f"store {body.get('store')!r}, expected false")
    if "reasoning.encrypted_content" not in (body.get("include") or []):
        problems.append(f"include {body.get('include')!r}")
    for tool in body.get("tools") or []:
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str) or "function" in tool \
                or not isinstance(tool.get("strict"), bool) or not isinstance(tool.get("parameters"), dict):
            problems.append(f"tool {tool!r}")
    items = body.get("input")
    if not isinstance(items, list) or not items:
        return problems + [f"input {items!r}"]
    calls = set()
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind == "message":
            content = item.get("content")
            if item.get("role") not in ("user", "assistant", "developer", "system") or not (
                    isinstance(content, str) or (isinstance(content, list) and all(
                        p.get("type") in ("input_text", "output_text") and isinstance(p.get("text"), str) for p in content))):
                problems.append(f"input[{i}] {item!r}")
        elif kind == "function_call":
            try:
                json.loads(item.get("arguments"))
            except (TypeError, ValueError):
                problems.append(f"input[{i}] arguments {item.get('arguments')!r}")
            if not item.get("call_id") or not isinstance(item.get("name"), str):
                problems.append(f"input[{i}] {item!r}")
            calls.add(item.get("call_id"))
        elif kind == "function_call_output":
            if item.get("call_id") not in calls or not isinstance(item.get("output"), str):
                problems.append(f"input[{i}] answers no earlier function_call: {item!r}")
        elif kind == "reasoning":
            with lock:
                if item not in state["reasoning"]:
                    problems.append(f"input[{i}] is a reasoning item this upstream never sent (or changed)")
        else:
            problems.append(f"input[{i}] has type {kind!r}")
    return problems


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def record(self, body, problems):
        key = hashlib.sha256(json.dumps({"path": self.path, **{k: body.get(k) for k in ("messages", "tools", "system", "input", "instructions")}}, sort_keys=True).encode()).hexdigest()[:16]
        with lock:
            state["counts"][key] = state["counts"].get(key, 0) + 1
            if state["counts"][key] > 1:
                # What was served more than once, in words, for a failing test to show.
                state["repeated"][key] = json.dumps(body.get("messages") or body.get("input"))[-200:]
            state["errors"].extend(problems)
            dump()

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
            dump()
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

    def responses_api(self, body):
        problems = check_responses(body, self.headers)
        self.record(body, problems)
        reply = pick(body)
        if problems or reply is None:
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"error": {"message": "; ".join(problems) or "script exhausted", "type": "invalid_request_error", "param": None, "code": None}}).encode())
            return
        usage = reply.get("usage", {"input_tokens": 10, "output_tokens": 5})
        with lock:
            n = len(state["reasoning"]) + 1
            reasoning = {"type": "reasoning", "id": f"rs_mock_{n}", "summary": [],
                         "encrypted_content": hashlib.sha256(f"thought {n}".encode()).hexdigest()}
            state["reasoning"].append(reasoning)
        output = [reasoning]
        if reply.get("content"):
            output.append({"type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": reply["content"], "annotations": []}]})
        for call in reply.get("tool_calls") or []:
            output.append({"type": "function_call", "id": "fc_" + call["id"], "call_id": call["id"], "status": "completed",
                           "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
        response = {"id": "resp_mock", "object": "response", "created_at": 1700000000, "status": "completed",
                    "error": None, "incomplete_details": None, "model": body["model"], "output": output, "store": False,
                    "usage": {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"],
                              "total_tokens": usage["input_tokens"] + usage["output_tokens"]}}
        if not body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(response).encode())
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        sequence = iter(range(1_000_000))

        def send(obj):
            obj = {**obj, "sequence_number": next(sequence)}
            self.wfile.write(f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()
        started = {**response, "status": "in_progress", "output": [], "usage": None}
        send({"type": "response.created", "response": started})
        send({"type": "response.in_progress", "response": started})
        for index, item in enumerate(output):
            if item["type"] == "message":
                send({"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "content": []}})
                text = item["content"][0]["text"]
                for word in text.split(" "):
                    send({"type": "response.output_text.delta", "item_id": item["id"], "output_index": index, "content_index": 0, "delta": word + " "})
                send({"type": "response.output_text.done", "item_id": item["id"], "output_index": index, "content_index": 0, "text": text})
            elif item["type"] == "function_call":
                send({"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "arguments": ""}})
                send({"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": index, "delta": item["arguments"]})
                send({"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": index, "arguments": item["arguments"]})
            else:
                send({"type": "response.output_item.added", "output_index": index, "item": {**item, "encrypted_content": None}})
            send({"type": "response.output_item.done", "output_index": index, "item": item})
        send({"type": "response.completed", "response": response})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", "0")))
        body = json.loads(raw)
        with lock:
            state["paths"][self.path] = state["paths"].get(self.path, 0) + 1
        if self.path == "/v1/responses":
            return self.responses_api(body)
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
