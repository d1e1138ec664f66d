"""The process tree of `cargo bench -p keel-cli --bench stop`.

Under `keel run`, `keel.input()` is {"role", "child"?}: the run first spawns a child with
role `child` (if given), then blocks in its role until it is stopped:
  parent  spawns four children, then waits on ipc.recv
  llm     a streamed chat completion through the kernel's OpenAI-compatible gateway
          (`OPENAI_BASE_URL`), read to the end
  llmcall an `llm.chat` syscall through the SDK (the kernel streams from the upstream)
  sleep   sys.sleep for an hour
  recv    ipc.recv
`python3 bench_tree.py floor` is the floor: the same 9 processes as a plain fork tree, all
sleeping; prints their pids as one JSON line.
"""

import http.client
import json
import os
import sys
import time
import urllib.parse

CHILDREN = [("llm", "llmcall"), ("sleep", "llm"), ("recv", "sleep"), ("llmcall", "recv")]


def stream_llm():
    base = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
    conn = http.client.HTTPConnection(base.hostname, base.port)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "stream slowly (gateway)"}], "stream": True}
    conn.request(
        "POST",
        base.path.rstrip("/") + "/chat/completions",
        body=json.dumps(body),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    assert response.status == 200, response.read()
    while response.readline():
        pass


def floor():
    pids = [os.getpid()]
    for _ in CHILDREN:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            grandchild = os.fork()
            if grandchild == 0:
                time.sleep(3600)
                os._exit(0)
            os.write(write, str(grandchild).encode())
            os.close(write)
            time.sleep(3600)
            os._exit(0)
        os.close(write)
        pids.append(pid)
        pids.append(int(os.read(read, 64)))
        os.close(read)
    print(json.dumps(pids), flush=True)
    time.sleep(3600)


def agent():
    import keel

    spec = keel.input()
    k = keel.connect()
    if spec["role"] == "parent":
        for role, child in CHILDREN:
            k.spawn(["python3", os.path.abspath(__file__)], input={"role": role, "child": child})
        k.recv()
        return
    if spec.get("child"):
        k.spawn(["python3", os.path.abspath(__file__)], input={"role": spec["child"]})
    if spec["role"] == "llm":
        stream_llm()
    elif spec["role"] == "llmcall":
        k.llm_chat([{"role": "user", "content": "stream slowly (syscall)"}], model="gpt-4o-mini")
    elif spec["role"] == "sleep":
        k.sleep(3_600_000)
    else:
        k.recv()


if __name__ == "__main__":
    if sys.argv[1:] == ["floor"]:
        floor()
    else:
        agent()
