"""Test agent: the official `mcp` Python client against the run's own MCP endpoint
($KEEL_MCP_URL, the run token as bearer). Lists the tools, calls `echo`, then a tool the
run is not granted, and exits with what it saw."""

from __future__ import annotations

import asyncio
import os

import keel
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


async def main() -> dict:
    headers = {"Authorization": f"Bearer {os.environ['KEEL_RUN_TOKEN']}"}
    async with streamablehttp_client(os.environ["KEEL_MCP_URL"], headers=headers) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
            ok = await session.call_tool("echo", {"hello": "mcp"})
            denied = await session.call_tool("fs.read", {"path": "x"})
            return {
                "tools": sorted(t.name for t in listed.tools),
                "ok": ok.model_dump(mode="json", exclude_none=True),
                "denied": denied.model_dump(mode="json", exclude_none=True),
            }


report = asyncio.run(main())
with keel.connect() as k:
    k.exit(report)
