"""flowmem behind each framework integration vs the framework's own store.

    python -m bench.integrations_bench [--lengths 100,10000] [--window 50]

For each length N the shared workload (bench/workload.py: re-fired results,
interrupted calls, late results) is loaded to N messages, then the next
``window`` messages are appended one per call and timed: µs per appended
message. Sendability is that of the whole stored history afterwards (OpenAI
Chat for LangChain/LangGraph via LangChain's own conversion, Responses items
for the Agents SDK), counted by bench/sendability.py. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import convert_to_messages, convert_to_openai_messages

import flowmem
from bench.sendability import count
from bench.workload import conversation
from flowmem.formats import from_openai_chat
from flowmem.integrations.agents import FlowmemSession, entry_items
from flowmem.integrations.langchain import FlowmemChatMessageHistory
from flowmem.integrations.langgraph import add_messages as flowmem_reducer

CTX = flowmem.ExecutionContext(user_id="bench")


def lc(messages: list[dict[str, Any]]) -> list[Any]:
    return list(convert_to_messages(messages))


def sendable_lc(messages: list[Any]) -> str:
    found = count(convert_to_openai_messages(messages))
    return "✅" if found.sendable else "✗"


def items_of(messages: list[dict[str, Any]]) -> list[Any]:
    return [item for entry in from_openai_chat(messages) for item in entry_items(entry)]


def sendable_items(items: list[Any]) -> str:
    from flowmem.formats import check
    return "✅" if not check(items, "responses") else "✗"


def timed(append: Callable[[Any], None], window: list[Any]) -> float:
    start = time.perf_counter()
    for message in window:
        append(message)
    return (time.perf_counter() - start) / len(window) * 1e6


def langchain_rows(n: int, window: int, tmp: Path) -> list[tuple[str, float, str]]:
    from langchain_community.chat_message_histories import SQLChatMessageHistory
    msgs = lc(conversation(n + window))
    rows = []
    with flowmem.Memory.from_url(f"sqlite:///{tmp / f'lc{n}.db'}") as memory:
        ours = FlowmemChatMessageHistory(memory, "user", "b", context=CTX)
        ours.add_messages(msgs[:n])
        cost = timed(lambda m: ours.add_messages([m]), msgs[n:])
        rows.append(("LangChain: FlowmemChatMessageHistory (sqlite)", cost,
                     sendable_lc(ours.messages)))
    theirs = SQLChatMessageHistory(session_id="b", connection=f"sqlite:///{tmp / f'sql{n}.db'}")
    theirs.add_messages(msgs[:n])
    cost = timed(lambda m: theirs.add_messages([m]), msgs[n:])
    rows.append(("LangChain: SQLChatMessageHistory (sqlite)", cost, sendable_lc(theirs.messages)))
    return rows


def langgraph_rows(n: int, window: int) -> list[tuple[str, float, str]]:
    from langgraph.graph.message import add_messages as langgraph_reducer
    rows = []
    for name, reducer in (("LangGraph: flowmem add_messages", flowmem_reducer),
                          ("LangGraph: add_messages", langgraph_reducer)):
        msgs = lc(conversation(n + window))
        state = reducer([], msgs[:n])
        box = [state]

        def step(message: Any, reducer: Any = reducer, box: list[Any] = box) -> None:
            box[0] = reducer(box[0], [message])

        cost = timed(step, msgs[n:])
        rows.append((name + " (in memory)", cost, sendable_lc(box[0])))
    return rows


def agents_rows(n: int, window: int, tmp: Path) -> list[tuple[str, float, str]]:
    from agents import SQLiteSession
    items = items_of(conversation(n + window))

    async def go() -> list[tuple[str, float, str]]:
        rows = []
        memory = flowmem.AsyncMemory.from_url(f"sqlite:///{tmp / f'ag{n}.db'}")
        for name, session in (("Agents SDK: FlowmemSession (sqlite)", FlowmemSession("b", memory)),
                              ("Agents SDK: SQLiteSession (sqlite file)",
                               SQLiteSession("b", str(tmp / f"sdk{n}.db")))):
            await session.add_items(items[:n])
            start = time.perf_counter()
            for item in items[n:]:
                await session.add_items([item])
            cost = (time.perf_counter() - start) / window * 1e6
            rows.append((name, cost, sendable_items(await session.get_items())))
        await memory.aclose()
        return rows

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="100,10000")
    parser.add_argument("--window", type=int, default=50)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    table: dict[str, dict[int, tuple[float, str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in lengths:
            rows = [*langchain_rows(n, args.window, Path(tmp)), *langgraph_rows(n, args.window),
                    *agents_rows(n, args.window, Path(tmp))]
            for name, cost, ok in rows:
                table.setdefault(name, {})[n] = (cost, ok)
    print("| store | " + " | ".join(f"µs/msg at {n:,}" for n in lengths)
          + " | history sendable |")
    print("|---|" + "---:|" * len(lengths) + "---|")
    for name, by_n in table.items():
        cells = " | ".join(f"{by_n[n][0]:,.0f}" for n in lengths)
        print(f"| {name} | {cells} | {' / '.join(by_n[n][1] for n in lengths)} |")


if __name__ == "__main__":
    main()
