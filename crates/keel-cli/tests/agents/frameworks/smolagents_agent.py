"""An unmodified smolagents agent (`smolagents[openai]` from PyPI): a ToolCallingAgent on
OpenAIServerModel, whose OpenAI client reads OPENAI_BASE_URL / OPENAI_API_KEY, which `keel
run` points at the kernel (Chat Completions). The model calls `add`, then smolagents'
`final_answer` tool. The `add` tool sleeps AGENT_TOOL_DELAY_MS so a test can kill the
kernel between the two LLM calls. Prints one JSON line with what it saw."""

import json
import os
import time

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

DELAY = int(os.environ.get("AGENT_TOOL_DELAY_MS", "0")) / 1000
tool_results = []


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    time.sleep(DELAY)
    tool_results.append(a + b)
    return a + b


agent = ToolCallingAgent(tools=[add], model=OpenAIServerModel(model_id="gpt-4o-mini"))
answer = agent.run("What is 2 + 3? Use the add tool.")
print(json.dumps({"framework": "smolagents", "api": "chat", "answer": str(answer), "tool_results": tool_results}))
