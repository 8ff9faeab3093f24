"""history(max_tokens=...) reads only what it returns: flat in the conversation's length.

    PYTHONPATH=src python -m bench.context_budget [--budget 2000]

Times ``history(max_tokens=B)`` (best of 30) and counts the messages it reads on
a 100- and a 100,000-message conversation, and ``history(last=N)`` + LangChain's
``trim_messages`` (N: what the budgeted read returned) on the long one. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import timeit
from typing import Any

from flowmem import Memory
from flowmem.context import approximate


def turn(i: int) -> list[dict[str, Any]]:
    call = f"c{i}"
    return [{"role": "user", "content": f"question {i}: where are the cats today?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": call, "type": "function",
             "function": {"name": "search", "arguments": '{"q": "cats"}'}}]},
            {"role": "tool", "tool_call_id": call, "content": "3 cats on the mat " * 4},
            {"role": "assistant", "content": f"There are 3 cats ({i})."}]


def best(run: Any) -> float:
    return min(timeit.repeat(run, "gc.enable()", number=1, repeat=30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=2000)
    args = parser.parse_args()
    memory = Memory.from_url(f"sqlite:///{tempfile.mkdtemp()}/bench.db")
    read = [0]
    history = memory.store.history

    def counting(*a: Any, **k: Any) -> Any:
        page = history(*a, **k)
        read[0] += len(page.positions)
        return page

    memory.store.history = counting  # type: ignore[method-assign]
    figures: dict[str, Any] = {"store": "sqlite", "budget": args.budget}
    for size, key in ((100, "short"), (100_000, "long")):
        memory.append("global", key, [{"role": "system", "content": "Be brief."}], context=None)
        turns = (size - 1) // 4
        for start in range(0, turns, 100):  # 400 messages an append
            batch = [m for i in range(start, min(start + 100, turns)) for m in turn(i)]
            memory.append("global", key, batch, context=None)
        read[0] = 0
        result = memory.history("global", key, context=None, max_tokens=args.budget)
        figures[f"{size} returned"] = len(result.messages)
        figures[f"{size} read"] = read[0]
        figures[f"{size} seconds"] = best(lambda k=key: memory.history(
            "global", k, context=None, max_tokens=args.budget))
    figures["ratio 100,000 / 100"] = figures["100000 seconds"] / figures["100 seconds"]

    from langchain_core.messages import convert_to_openai_messages, trim_messages

    from flowmem.integrations.langchain import from_entries

    def trimmed() -> None:
        page = memory.history("global", "long", context=None, last=figures["100000 returned"])
        trim_messages(from_entries(page.messages), max_tokens=args.budget,
                      token_counter=lambda ms: approximate(convert_to_openai_messages(ms)),
                      strategy="last", start_on="human", include_system=True,
                      allow_partial=False)

    figures["history(last=N)+trim_messages seconds"] = best(trimmed)
    figures["trim / max_tokens"] = (figures["history(last=N)+trim_messages seconds"]
                                    / figures["100000 seconds"])
    print(json.dumps(figures, indent=1))
    memory.close()


if __name__ == "__main__":
    main()
