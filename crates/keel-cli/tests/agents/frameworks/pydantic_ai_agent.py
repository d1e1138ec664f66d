"""An unmodified Pydantic AI agent (`pydantic-ai-slim[openai]` from PyPI). It knows nothing
of Keel: its OpenAI provider's client reads OPENAI_BASE_URL / OPENAI_API_KEY, which `keel
run` points at the kernel. `openai:<model>` is the Responses API (Pydantic AI's default);
AGENT_API=chat names `openai-chat:<model>`. The `add` tool sleeps AGENT_TOOL_DELAY_MS so a
test can kill the kernel between the two LLM calls. Prints one JSON line with what it saw."""

import json
import os
import time

from pydantic_ai import Agent

API = os.environ.get("AGENT_API", "responses")
DELAY = int(os.environ.get("AGENT_TOOL_DELAY_MS", "0")) / 1000
tool_results = []

agent = Agent(
    "openai-chat:gpt-4o-mini" if API == "chat" else "openai:gpt-4o-mini",
    instructions="Add numbers with the add tool.",
)


@agent.tool_plain
def add(a: int, b: int) -> int:
    """Add two integers."""
    time.sleep(DELAY)
    tool_results.append(a + b)
    return a + b


result = agent.run_sync("What is 2 + 3? Use the add tool.")
print(json.dumps({"framework": "pydantic-ai", "api": API, "answer": result.output, "tool_results": tool_results}))
