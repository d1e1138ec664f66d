"""Drive the kernel's own MCP endpoint (`keel serve`'s /mcp) with the official `mcp` Python
client, 1.x or 2.x (whichever this interpreter has); print one JSON report.

Usage: mcp_api_client.py <url> <owner token> <other tenant's token> <agent script>

As the owner: list the tools and resource templates, refuse bad arguments, start a run of
the agent through `run_agent`, poll `get_run` until it ends, read it back as the resources
keel://runs/{id} and keel://runs/{id}/journal and find it in `resources/list`. As the other
tenant: the same run through `get_run` and a resource read. Every warning the SDK logs
(e.g. "Session termination failed") is reported too.
"""

import asyncio
import importlib.metadata
import json
import logging
import sys

from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

try:  # 2.x
    from mcp.shared.exceptions import MCPError as ProtocolError
except ImportError:  # 1.x
    from mcp.shared.exceptions import McpError as ProtocolError


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def dump(result) -> dict:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def error_code(error: Exception) -> int | None:
    code = getattr(error, "code", None)  # 2.x
    if code is None and getattr(error, "error", None) is not None:  # 1.x
        code = error.error.code
    return code


async def session_for(url: str, token: str):
    """An initialized session; the caller closes the returned stack."""
    from contextlib import AsyncExitStack

    stack = AsyncExitStack()
    http = await stack.enter_async_context(create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
    streams = await stack.enter_async_context(streamable_http_client(url, http_client=http))
    session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
    init = await session.initialize()
    return stack, session, dump(init)


async def main() -> dict:
    url, token, other_token, agent = sys.argv[1:5]
    report: dict = {"sdk": importlib.metadata.version("mcp")}
    stack, session, init = await session_for(url, token)
    async with stack:
        report["server"] = init["serverInfo"]["name"]
        report["capabilities"] = sorted(init["capabilities"])
        report["instructions"] = init.get("instructions", "")
        report["tools"] = [dump(tool) for tool in (await session.list_tools()).tools]
        templates = await session.list_resource_templates()
        report["templates"] = [t["uriTemplate"] for t in dump(templates)["resourceTemplates"]]
        report["bad_get"] = dump(await session.call_tool("get_run", {}))
        report["bad_run"] = dump(await session.call_tool("run_agent", {"command": []}))
        report["bad_id"] = dump(await session.call_tool("pause_run", {"run_id": "run_nope"}))
        started = await session.call_tool(
            "run_agent",
            {"command": ["python3", agent], "input": {"from": "mcp"}, "sandbox": {"tier": "none"}},
        )
        report["started"] = dump(started)
        run_id = dump(started)["structuredContent"]["run_id"]
        for _ in range(600):
            got = dump(await session.call_tool("get_run", {"run_id": run_id}))
            if got.get("structuredContent", {}).get("state") in ("succeeded", "failed", "cancelled"):
                break
            await asyncio.sleep(0.1)
        report["got"] = got
        report["logs"] = dump(await session.call_tool("get_run_logs", {"run_id": run_id}))
        report["listed"] = dump(await session.call_tool("list_runs", {"state": "succeeded"}))
        run = await session.read_resource(f"keel://runs/{run_id}")
        report["resource"] = dump(run)
        journal = await session.read_resource(f"keel://runs/{run_id}/journal")
        report["journal"] = dump(journal)
        report["resources"] = [r["uri"] for r in dump(await session.list_resources())["resources"]]
        try:
            await session.read_resource("keel://nothing/here")
            report["unknown_resource"] = "read"
        except ProtocolError as error:
            report["unknown_resource"] = error_code(error)
    stack, other, _ = await session_for(url, other_token)
    async with stack:
        report["other_get"] = dump(await other.call_tool("get_run", {"run_id": run_id}))
        report["other_stop"] = dump(await other.call_tool("stop_run", {"run_id": run_id}))
        report["other_list"] = dump(await other.call_tool("list_runs", {}))
        report["other_resources"] = [r["uri"] for r in dump(await other.list_resources())["resources"]]
        try:
            await other.read_resource(f"keel://runs/{run_id}")
            report["other_resource"] = "read"
        except ProtocolError as error:
            report["other_resource"] = error_code(error)
    report["run_id"] = run_id
    return report


warnings = Warnings()
logging.getLogger().addHandler(warnings)
logging.getLogger().setLevel(logging.WARNING)
result = asyncio.run(main())
# The sessions were closed (DELETE) when their stacks exited.
result["warnings"] = warnings.messages
print(json.dumps(result))
