"""An AG-UI client for the tests: reads a run's AG-UI event stream from Keel, validates
every event with the `ag-ui-protocol` package's pydantic models (`ag_ui.core.Event`),
checks the sequence rules AG-UI consumers rely on, and answers the run's question
(`CUSTOM keel.question`) when asked to.

Usage: agui_client.py CONFIG, CONFIG being JSON: {"base", "token", "answer"?: text,
and either "run": id (GET /v1/runs/{id}/agui) or "input": a RunAgentInput (POST
/v1/agui)}. Prints one JSON line: what was streamed.
"""

from __future__ import annotations

import json
import sys
import urllib.request

from ag_ui.core import Event, EventType
from pydantic import TypeAdapter

EVENT = TypeAdapter(Event)


def request(config, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(config["base"] + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + config["token"])
    if data is not None:
        req.add_header("Content-Type", "application/json")
    return urllib.request.urlopen(req, timeout=60)


def sse_data(response):
    """The `data` of each server-sent event, as AG-UI's encoder writes them."""
    lines = []
    for raw in response:
        line = raw.decode().rstrip("\r\n")
        if line == "":
            if lines:
                yield "\n".join(lines)
                lines = []
        elif line.startswith("data:"):
            lines.append(line[5:].lstrip(" "))
        elif line.startswith(":"):
            continue  # a keep-alive comment
        else:
            raise AssertionError(f"unexpected SSE line {line!r}")
    assert not lines, "the stream ended inside an event"


def main() -> None:
    config = json.loads(sys.argv[1])
    if "input" in config:
        response = request(config, "POST", "/v1/agui", config["input"])
        run = response.headers["X-Keel-Run-Id"]
    else:
        run = config["run"]
        response = request(config, "GET", f"/v1/runs/{run}/agui")
    assert response.headers["Content-Type"].startswith("text/event-stream"), response.headers

    events = []
    open_messages, open_calls, ended_calls = {}, set(), set()
    texts = {}
    for data in sse_data(response):
        raw = json.loads(data)
        event = EVENT.validate_python(raw)  # the protocol's own models
        assert event.model_dump(mode="json", by_alias=True, exclude_none=True)["type"] == raw["type"]
        kind = event.type
        if not events:
            assert kind == EventType.RUN_STARTED, f"first event is {kind}"
        else:
            assert events[-1]["type"] not in ("RUN_FINISHED", "RUN_ERROR"), "an event after the end"
            assert kind != EventType.RUN_STARTED, "RUN_STARTED twice"
        if kind == EventType.TEXT_MESSAGE_START:
            assert event.message_id not in open_messages and event.message_id not in texts
            open_messages[event.message_id] = []
        elif kind == EventType.TEXT_MESSAGE_CONTENT:
            open_messages[event.message_id].append(event.delta)
        elif kind == EventType.TEXT_MESSAGE_END:
            texts[event.message_id] = "".join(open_messages.pop(event.message_id))
        elif kind == EventType.TOOL_CALL_START:
            assert event.tool_call_id not in open_calls | ended_calls
            open_calls.add(event.tool_call_id)
        elif kind == EventType.TOOL_CALL_ARGS:
            assert event.tool_call_id in open_calls
        elif kind == EventType.TOOL_CALL_END:
            open_calls.remove(event.tool_call_id)
            ended_calls.add(event.tool_call_id)
        elif kind == EventType.TOOL_CALL_RESULT:
            assert event.tool_call_id in ended_calls, f"a result for {event.tool_call_id}, never ended"
        elif kind in (EventType.RUN_FINISHED, EventType.RUN_ERROR):
            assert not open_messages and not open_calls, "the run ended with messages or calls open"
        elif kind == EventType.CUSTOM and event.name == "keel.question" and "answer" in config:
            request(config, "POST", f"/v1/runs/{run}/answer", {"text": config["answer"]}).read()
        events.append(raw)
    assert events and events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"), "the stream ended before the run"
    print(json.dumps({"run": run, "events": events, "texts": texts}))


if __name__ == "__main__":
    main()
