"""An unmodified CrewAI crew (`crewai` from PyPI): one agent with one tool and one task.
CrewAI's OpenAI provider reads OPENAI_BASE_URL / OPENAI_API_KEY, which `keel run` points
at the kernel (Chat Completions; `keel run` also turns off CrewAI's telemetry, which
would otherwise try to reach its collector from a sandbox without network). The `add`
tool sleeps AGENT_TOOL_DELAY_MS so a test can kill the kernel between the two LLM calls.
Prints one JSON line with what it saw."""

import json
import os
import time

from crewai import Agent, Crew, Task
from crewai.tools import tool

DELAY = int(os.environ.get("AGENT_TOOL_DELAY_MS", "0")) / 1000
tool_results = []


@tool("add")
def add(a: int, b: int) -> int:
    """Add two integers."""
    time.sleep(DELAY)
    tool_results.append(a + b)
    return a + b


calculator = Agent(
    role="Calculator",
    goal="Answer arithmetic questions exactly",
    backstory="You add numbers with the add tool.",
    tools=[add],
    llm="gpt-4o-mini",
)
task = Task(description="What is 2 + 3? Use the add tool.", expected_output="The sum.", agent=calculator)
result = Crew(agents=[calculator], tasks=[task]).kickoff()
print(json.dumps({"framework": "crewai", "api": "chat", "answer": result.raw, "tool_results": tool_results}))
