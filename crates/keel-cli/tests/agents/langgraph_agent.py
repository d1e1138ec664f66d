"""An unmodified LangGraph tool-calling agent (langgraph + langchain-openai from PyPI). It
knows nothing of Keel: ChatOpenAI reads OPENAI_BASE_URL / OPENAI_API_KEY, which `keel run`
points at the kernel. The `add` tool sleeps LANGGRAPH_TOOL_DELAY_MS so a test can kill the
kernel mid-run. Prints the final answer as JSON."""

import json
import os
import time
from typing import Annotated, TypedDict

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

DELAY = int(os.environ.get("LANGGRAPH_TOOL_DELAY_MS", "0")) / 1000


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    time.sleep(DELAY)
    return a + b


class State(TypedDict):
    messages: Annotated[list, add_messages]


model = ChatOpenAI(model="gpt-4o-mini", temperature=0, max_retries=0).bind_tools([add])


def think(state: State):
    return {"messages": [model.invoke(state["messages"])]}


def act(state: State):
    results = []
    for call in state["messages"][-1].tool_calls:
        results.append(ToolMessage(content=str(add.invoke(call["args"])), tool_call_id=call["id"]))
    return {"messages": results}


def route(state: State):
    return "act" if state["messages"][-1].tool_calls else END


graph = StateGraph(State)
graph.add_node("think", think)
graph.add_node("act", act)
graph.add_edge(START, "think")
graph.add_conditional_edges("think", route, ["act", END])
graph.add_edge("act", "think")
app = graph.compile()

result = app.invoke({"messages": [HumanMessage("What is (2 + 3) + 4? Use the add tool for each step.")]})
print(json.dumps({"answer": result["messages"][-1].content, "messages": len(result["messages"])}))
