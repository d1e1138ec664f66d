"""An unmodified OpenAI Agents SDK agent (`openai-agents` from PyPI). It knows nothing of
Keel: the SDK's OpenAI client reads OPENAI_BASE_URL / OPENAI_API_KEY, which `keel run`
points at the kernel (and `keel run` turns off the SDK's trace exporter, which would
otherwise post to api.openai.com). The SDK's default is the Responses API;
AGENT_API=chat uses its documented switch to Chat Completions. The `add` tool sleeps
AGENT_TOOL_DELAY_MS so a test can kill the kernel between the two LLM calls. Prints one
JSON line with what it saw."""

import json
import os
import time

from agents import Agent, Runner, function_tool, set_default_openai_api

API = os.environ.get("AGENT_API", "responses")
DELAY = int(os.environ.get("AGENT_TOOL_DELAY_MS", "0")) / 1000
if API == "chat":
    set_default_openai_api("chat_completions")
tool_results = []


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    time.sleep(DELAY)
    tool_results.append(a + b)
    return a + b


agent = Agent(name="calculator", instructions="Add numbers with the add tool.", model="gpt-4o-mini", tools=[add])
result = Runner.run_sync(agent, "What is 2 + 3? Use the add tool.")
print(json.dumps({"framework": "openai-agents", "api": API, "answer": result.final_output, "tool_results": tool_results}))
