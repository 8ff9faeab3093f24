"""flowmem behind each framework integration vs the framework's own store.

    python -m bench.integrations_bench [--lengths 100,10000] [--window 30] [--trials 3]
                                       [--only langchain,langgraph,agents]

For each length N every contender is loaded with the first N messages of the
shared workload (bench/workload.py: re-fired results, interrupted calls,
late results), then the following messages are appended one per call, in
``trials`` windows of ``window`` messages interleaved across the contenders
of one framework: µs per appended message is the median window. Sendability
is judged on what the framework would send at the next user turn: the
stored history after appending up to and including the next user message
(OpenAI Chat through LangChain's own conversion for LangChain and LangGraph,
Responses items for the Agents SDK), checked by :func:`flowmem.formats.check`.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import convert_to_messages, convert_to_openai_messages

import flowmem
from bench.workload import conversation, rest_of_turn
from flowmem.formats import check, from_openai_chat
from flowmem.integrations.agents import FlowmemSession, entry_items
from flowmem.integrations.langchain import FlowmemChatMessageHistory
from flowmem.integrations.langgraph import add_messages as flowmem_reducer

CTX = flowmem.ExecutionContext(user_id="bench")
LOOP = asyncio.new_event_loop()


class Contender:
    """One store behind one framework interface: load, append one, read the history."""

    def __init__(self, name: str, load: Callable[[list[Any]], None],
                 append: Callable[[Any], None], sendable: Callable[[], bool]) -> None:
        self.name, self.load, self.append, self.sendable = name, load, append, sendable


def langchain(tmp: Path, n: int) -> list[Contender]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langchain_community.chat_message_histories import SQLChatMessageHistory
    memory = flowmem.Memory.from_url(f"sqlite:///{tmp / f'lc{n}.db'}")
    ours = FlowmemChatMessageHistory(memory, "user", "b", context=CTX)
    theirs = SQLChatMessageHistory(session_id="b", connection=f"sqlite:///{tmp / f'sql{n}.db'}")

    def ok(history: Any) -> Callable[[], bool]:
        return lambda: not check(convert_to_openai_messages(history.messages), "openai")

    return [Contender("LangChain: `FlowmemChatMessageHistory` (flowmem `sqlite://`)",
                      ours.add_messages, lambda m: ours.add_messages([m]), ok(ours)),
            Contender("LangChain: `SQLChatMessageHistory` (SQLite)", theirs.add_messages,
                      lambda m: theirs.add_messages([m]), ok(theirs))]


def langgraph(tmp: Path, n: int) -> list[Contender]:
    from langgraph.graph.message import add_messages as langgraph_reducer

    def make(name: str, reducer: Any) -> Contender:
        box: list[Any] = [[]]

        def append(messages: Any) -> None:
            box[0] = reducer(box[0], messages)

        return Contender(name, append, lambda m: append([m]),
                         lambda: not check(convert_to_openai_messages(box[0]), "openai"))

    return [make("LangGraph: flowmem `add_messages` (in memory)", flowmem_reducer),
            make("LangGraph: `add_messages` (in memory)", langgraph_reducer)]


def agents(tmp: Path, n: int) -> list[Contender]:
    from agents import SQLiteSession
    memory = flowmem.AsyncMemory.from_url(f"sqlite:///{tmp / f'ag{n}.db'}")
    sessions = [("Agents SDK: `FlowmemSession` (flowmem `sqlite://`)", FlowmemSession("b", memory)),
                ("Agents SDK: `SQLiteSession` (SQLite file)",
                 SQLiteSession("b", str(tmp / f"sdk{n}.db")))]

    def make(name: str, session: Any) -> Contender:
        def load(items: list[Any]) -> None:
            LOOP.run_until_complete(session.add_items(items))

        return Contender(name, load, lambda item: load([item]), lambda: not check(
            LOOP.run_until_complete(session.get_items()), "responses"))

    return [make(name, session) for name, session in sessions]


def items_of(messages: list[dict[str, Any]]) -> list[Any]:
    """Workload messages as the Responses items the Agents SDK would store."""
    return [item for entry in from_openai_chat(messages) for item in entry_items(entry)]


def measure(contenders: list[Contender], messages: list[Any], n: int, window: int,
            trials: int, turn_end: int) -> list[tuple[str, float, bool]]:
    for contender in contenders:
        contender.load(messages[:n])
    costs: dict[str, list[float]] = {c.name: [] for c in contenders}
    for trial in range(trials):
        chunk = messages[n + trial * window:n + (trial + 1) * window]
        for contender in contenders:
            start = time.perf_counter()
            for message in chunk:
                contender.append(message)
            costs[contender.name].append((time.perf_counter() - start) / len(chunk) * 1e6)
    rows = []
    for contender in contenders:
        contender.load(messages[n + trials * window:turn_end])
        rows.append((contender.name, statistics.median(costs[contender.name]),
                     contender.sendable()))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="100,10000")
    parser.add_argument("--window", type=int, default=30)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--only", default="langchain,langgraph,agents",
                        help="frameworks to measure, comma-separated")
    args = parser.parse_args()
    frameworks = {"langchain": langchain, "langgraph": langgraph, "agents": agents}
    chosen = [frameworks[name] for name in args.only.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    table: dict[str, dict[int, tuple[float, bool]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in lengths:
            chat = conversation(n + args.window * args.trials + 200)
            turn_end = rest_of_turn(chat, n + args.window * args.trials) + 1
            for make in chosen:
                convert = items_of if make is agents else convert_to_messages
                messages = list(convert(chat))
                end = turn_end if make is not agents else len(items_of(chat[:turn_end]))
                start = len(items_of(chat[:n])) if make is agents else n
                for name, cost, ok in measure(make(Path(tmp), n), messages, start,
                                              args.window, args.trials, end):
                    table.setdefault(name, {})[n] = (cost, ok)
    print("| store | " + " | ".join(f"µs per message at {n:,}" for n in lengths)
          + " | sendable at the next user turn |")
    print("|---|" + "---:|" * len(lengths) + "---|")
    for name, by_n in table.items():
        cells = " | ".join(f"{by_n[n][0]:,.0f}" for n in lengths)
        marks = " / ".join("✅" if by_n[n][1] else "✗" for n in lengths)
        print(f"| {name} | {cells} | {marks} |")


if __name__ == "__main__":
    main()
