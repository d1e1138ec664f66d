"""The official `a2a-sdk` client (pinned, 1.3.0) against Keel's A2A server (tests/it/a2a.rs).

argv[1] is JSON: {"base": "http://host:port", "token": ..., "tenant_token": ...}. It
drives the `echo` agent (tests/agents/a2a_agent.py) through the SDK's own client: the
card, a blocking send, the input-required round trip, streaming, cancel, list, errors,
subscribe and a push notification; then the 0.3 method names over raw JSON-RPC. Every
check is an assert; on success it prints a JSON summary for the Rust side to check too.
"""

import asyncio
import json
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
from google.protobuf import json_format, struct_pb2
from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
)

CONFIG = json.loads(sys.argv[1])
BASE = CONFIG["base"]
AGENT = BASE + "/a2a/echo"


def user(text, task_id="", context_id="", message_id=None):
    return Message(
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        message_id=message_id or str(uuid.uuid4()),
        task_id=task_id,
        context_id=context_id,
    )


async def send(client, message, **configuration):
    request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(**configuration))
    events = [event async for event in client.send_message(request)]
    assert len(events) == 1, events
    assert events[0].WhichOneof("payload") == "task", events[0]
    return events[0].task


class Hook(BaseHTTPRequestHandler):
    """Receives push notifications."""

    received = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.received.append(
            {
                "token": self.headers.get("X-A2A-Notification-Token"),
                "authorization": self.headers.get("Authorization"),
                "body": json.loads(body),
            }
        )
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


async def main():
    summary = {}
    headers = {"Authorization": f"Bearer {CONFIG['token']}"}
    http = httpx.AsyncClient(headers=headers, timeout=60)

    # The cards: the first agent's at the root, each one's under /a2a/NAME; no token needed.
    root = httpx.get(BASE + "/.well-known/agent-card.json").json()
    card = httpx.get(AGENT + "/.well-known/agent-card.json").json()
    assert root == card, (root, card)
    assert card["name"] == "echo" and card["capabilities"]["streaming"] is True, card
    assert card["supportedInterfaces"][0] == {
        "url": AGENT,
        "protocolBinding": "JSONRPC",
        "protocolVersion": "1.0",
    }, card
    assert card["skills"][0]["id"] == "echo", card
    assert httpx.get(BASE + "/a2a/nobody/.well-known/agent-card.json").status_code == 404

    client = await create_client(AGENT, client_config=ClientConfig(httpx_client=http, streaming=False))

    # A blocking send: the task comes back completed, the output its artifact.
    done = await send(client, user("hello"))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
    assert done.artifacts[0].parts[0].text == "echo: hello", done
    assert done.history[0].parts[0].text == "hello", done
    summary["completed"] = done.id

    # The same message again (a retry): the same task, not a second run.
    again_id = str(uuid.uuid4())
    first = await send(client, user("twice", message_id=again_id))
    second = await send(client, user("twice", message_id=again_id))
    assert first.id == second.id, (first.id, second.id)
    summary["retried"] = first.id

    # Structured data and a caller's context reach the agent.
    data_message = user("data", context_id="ctx-42")
    data_message.parts.append(Part(data=json_format.ParseDict({"n": 7}, struct_pb2.Value())))
    data = await send(client, data_message)
    assert data.context_id == "ctx-42", data
    echoed = json_format.MessageToDict(data.artifacts[0].parts[0].data)
    assert echoed["echo"]["n"] == 7 and echoed["context"] == "ctx-42", echoed

    # input-required: the agent's human.ask is the status message; the next message answers it.
    asked = await send(client, user("ask"))
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, asked
    assert asked.status.message.parts[0].text == "Which city?", asked
    answered = await send(client, user("Paris", task_id=asked.id, context_id=asked.context_id))
    assert answered.id == asked.id
    assert answered.status.state == TaskState.TASK_STATE_COMPLETED, answered
    assert answered.artifacts[0].parts[0].text == "got: Paris", answered
    got = await client.get_task(GetTaskRequest(id=asked.id))
    assert [m.parts[0].text for m in got.history] == ["ask", "Which city?", "Paris"], got.history
    last = await client.get_task(GetTaskRequest(id=asked.id, history_length=1))
    assert [m.parts[0].text for m in last.history] == ["Paris"], last.history
    summary["input_required"] = asked.id

    # A failed run is a failed task, saying why.
    failed = await send(client, user("fail"))
    assert failed.status.state == TaskState.TASK_STATE_FAILED, failed
    assert failed.status.message.parts[0].text, failed

    # Cancel: a slow task returned at once, then canceled; an ended one cannot be.
    slow = await send(client, user("slow"), return_immediately=True)
    assert slow.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING), slow
    canceled = await client.cancel_task(CancelTaskRequest(id=slow.id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED, canceled
    summary["canceled"] = slow.id
    try:
        await client.cancel_task(CancelTaskRequest(id=done.id))
        raise AssertionError("an ended task was canceled")
    except TaskNotCancelableError:
        pass
    try:
        await client.get_task(GetTaskRequest(id="run_00000000000000000000000000"))
        raise AssertionError("a missing task was found")
    except TaskNotFoundError:
        pass

    # ListTasks: newest first, paged, filtered by state and context.
    listed = await client.list_tasks(ListTasksRequest(page_size=3, include_artifacts=True))
    assert listed.total_size == 6, listed.total_size
    assert len(listed.tasks) == 3 and listed.next_page_token, listed
    assert listed.tasks[0].id == slow.id, [t.id for t in listed.tasks]
    rest = await client.list_tasks(ListTasksRequest(page_size=100, page_token=listed.next_page_token))
    ids = [t.id for t in listed.tasks] + [t.id for t in rest.tasks]
    assert len(ids) == len(set(ids)) == listed.total_size, ids
    completed = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED, page_size=100))
    assert all(t.status.state == TaskState.TASK_STATE_COMPLETED for t in completed.tasks)
    assert done.id in [t.id for t in completed.tasks] and slow.id not in [t.id for t in completed.tasks]
    by_context = await client.list_tasks(ListTasksRequest(context_id="ctx-42"))
    assert [t.id for t in by_context.tasks] == [data.id], by_context

    # Streaming: the task, its progress, the artifact, then the end; the stream closes.
    streaming = await create_client(AGENT, client_config=ClientConfig(httpx_client=http))
    events = [e async for e in streaming.send_message(SendMessageRequest(message=user("streamed")))]
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and kinds[-2:] == ["artifact_update", "status_update"], kinds
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED, events[-1]
    assert events[-2].artifact_update.artifact.parts[0].text == "echo: streamed", events[-2]
    summary["stream_kinds"] = kinds

    # A streamed question ends its stream at input-required; the answer streams the rest.
    events = [e async for e in streaming.send_message(SendMessageRequest(message=user("ask")))]
    last_status = [e for e in events if e.WhichOneof("payload") == "status_update"][-1].status_update
    assert last_status.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, events
    task_id = events[0].task.id

    # Subscribe to it, and answer from the other client while subscribed.
    subscribed = []
    following = asyncio.Event()

    async def follow():
        async for event in streaming.subscribe(SubscribeToTaskRequest(id=task_id)):
            subscribed.append(event)
            following.set()

    follower = asyncio.create_task(follow())
    # Answer only once the subscription holds the task (its first event), however slow
    # the machine: an answer before that would end the task before it is followed.
    await asyncio.wait_for(following.wait(), 30)
    await send(client, user("Lyon", task_id=task_id))
    await asyncio.wait_for(follower, 30)
    kinds = [e.WhichOneof("payload") for e in subscribed]
    assert kinds[0] == "task", kinds
    assert subscribed[0].task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, subscribed[0]
    assert subscribed[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED, subscribed
    assert any(
        e.WhichOneof("payload") == "artifact_update" and e.artifact_update.artifact.parts[0].text == "got: Lyon"
        for e in subscribed
    ), subscribed
    summary["subscribed_kinds"] = kinds

    # Push notifications: a webhook with a token and credentials hears the task end.
    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook_url = f"http://127.0.0.1:{server.server_port}/hook"
    pushed = await send(client, user("ask"))
    config = await client.create_task_push_notification_config(
        TaskPushNotificationConfig(
            task_id=pushed.id,
            id="cfg-1",
            url=hook_url,
            token="notify-token",
            authentication={"scheme": "Bearer", "credentials": "hook-secret"},
        )
    )
    assert config.id == "cfg-1" and config.url == hook_url, config
    await send(client, user("Nice", task_id=pushed.id))
    for _ in range(600):  # up to 30 s on a loaded machine
        ended = [
            r for r in Hook.received
            if r["body"].get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED"
        ]
        if ended:
            break
        await asyncio.sleep(0.05)
    assert ended, Hook.received
    assert all(r["token"] == "notify-token" for r in Hook.received), Hook.received
    assert all(r["authorization"] == "Bearer hook-secret" for r in Hook.received), Hook.received
    summary["pushes"] = len(Hook.received)
    server.shutdown()

    await client.close()
    await streaming.close()
    await http.aclose()

    # The 0.3 names answer in 0.3's shapes.
    def rpc(method, params, token=CONFIG["token"]):
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        answer = httpx.post(AGENT, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()

    old = rpc(
        "message/send",
        {
            "message": {"kind": "message", "messageId": str(uuid.uuid4()), "role": "user", "parts": [{"kind": "text", "text": "old"}]},
            "configuration": {"blocking": True},
        },
    )["result"]
    assert old["kind"] == "task" and old["status"]["state"] == "completed", old
    assert old["artifacts"][0]["parts"][0] == {"kind": "text", "text": "echo: old"}, old
    fetched = rpc("tasks/get", {"id": old["id"]})["result"]
    assert fetched["kind"] == "task" and fetched["id"] == old["id"], fetched
    assert rpc("tasks/get", {"id": "nope"})["error"]["code"] == -32001

    # Bad requests get JSON-RPC's own errors; nothing malformed starts a run.
    assert rpc("Nope", {})["error"]["code"] == -32601
    assert rpc("SendMessage", {"message": {"role": "ROLE_USER", "parts": [{"text": "x"}]}})["error"]["code"] == -32602
    assert rpc("SendMessage", {"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}})["error"]["code"] == -32602
    bad = httpx.post(AGENT, content=b"{not json", headers={"Authorization": f"Bearer {CONFIG['token']}"})
    assert bad.json()["error"]["code"] == -32700, bad.text
    assert httpx.post(AGENT, json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"}).status_code == 401

    # Another tenant's token sees none of these tasks.
    if CONFIG.get("tenant_token"):
        other = rpc("GetTask", {"id": done.id}, token=CONFIG["tenant_token"])
        assert other["error"]["code"] == -32001, other
        mine = rpc("ListTasks", {}, token=CONFIG["tenant_token"])["result"]
        assert mine["tasks"] == [] and mine["totalSize"] == 0, mine

    print(json.dumps(summary))


asyncio.run(main())
