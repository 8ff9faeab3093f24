"""Conversion cost of flowmem.formats next to the append cost, per message.

``python bench/formats_bench.py [--length 10000] [--repeat 5]``

The benchmark workload (:mod:`bench.workload`: re-fires, interruptions, late
results) is appended one message per call to a :class:`flowmem.ConversationBuffer`
(the append cost, µs per incoming message); the stored history is then
rendered whole by ``to_openai_chat``, ``to_responses`` and ``to_anthropic``
(MEM-5 repair plus the provider's rules), and read back by the matching
``from_*``. Figures are the best of ``--repeat`` runs, µs per stored message,
GC paused while timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import conversation
from flowmem import ConversationBuffer, formats


def _best(work: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        start = time.perf_counter_ns()
        result = work()
        best = min(best, time.perf_counter_ns() - start)
        gc.enable()
    return best / 1000, result


def _append_all(messages: list[dict[str, Any]]) -> ConversationBuffer:
    buffer = ConversationBuffer()
    for message in messages:
        buffer.append(message)
    return buffer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    incoming = conversation(args.length)
    append_us, buffer = _best(lambda: _append_all(incoming), args.repeat)
    history = buffer.messages
    figures: dict[str, Any] = {"incoming messages": len(incoming),
                               "stored messages": len(history),
                               "append µs/message": round(append_us / len(incoming), 2)}
    for name, render, read in (
            ("openai", formats.render_openai_chat, formats.from_openai_chat),
            ("responses", formats.render_responses, formats.from_responses),
            ("anthropic", formats.render_anthropic, formats.from_anthropic)):
        out_us, rendered = _best(lambda r=render: r(history), args.repeat)  # type: ignore[misc]
        payload = rendered.output["messages"] if name == "anthropic" else rendered.output
        in_us, _ = _best(lambda p=payload, f=read: f(p), args.repeat)  # type: ignore[misc]
        figures[f"to_{name} µs/message"] = round(out_us / len(history), 2)
        figures[f"from_{name} µs/message"] = round(in_us / len(history), 2)
        figures[f"to_{name} dropped"] = rendered.dropped
    print(json.dumps(figures, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
