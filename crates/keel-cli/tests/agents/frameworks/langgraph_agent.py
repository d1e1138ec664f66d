"""An unmodified LangGraph agent (langgraph + langchain-openai from PyPI), a prebuilt-free
graph of a model node and a tool node. ChatOpenAI reads OPENAI_BASE_URL / OPENAI_API_KEY,
which `keel run` points at the kernel; Chat Completions by default, the Responses API
with AGENT_API=responses (`use_responses_api=True`). The `add` tool sleeps
AGENT_TOOL_DELAY_MS so a test can kill the kernel between the two LLM calls. Prints one
JSON line with what it saw."""

import json
import os
import time
from typing import Annotated, TypedDict

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

API = os.environ.get("AGENT_API", "chat")
DELAY = int(os.environ.get("AGENT_TOOL_DELAY_MS", "0")) / 1000
tool_results = []


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    time.sleep(DELAY)
    tool_results.append(a + b)
    return a + b


class State(TypedDict):
    messages: Annotated[list, add_messages]


model = ChatOpenAI(model="gpt-4o-mini", max_retries=0, use_responses_api=API == "responses").bind_tools([add])


def think(state: State):
    return {"messages": [model.invoke(state["messages"])]}


def act(state: State):
    calls = state["messages"][-1].tool_calls
    return {"messages": [ToolMessage(content=str(add.invoke(c["args"])), tool_call_id=c["id"]) for c in calls]}


graph = StateGraph(State)
graph.add_node("think", think)
graph.add_node("act", act)
graph.add_edge(START, "think")
graph.add_conditional_edges("think", lambda s: "act" if s["messages"][-1].tool_calls else END, ["act", END])
graph.add_edge("act", "think")
result = graph.compile().invoke({"messages": [HumanMessage("What is 2 + 3? Use the add tool.")]})
answer = result["messages"][-1].text
print(json.dumps({"framework": "langgraph", "api": API, "answer": answer, "tool_results": tool_results}))
