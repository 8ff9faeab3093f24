"""Core benchmark: µs per appended message for ``ConversationBuffer`` vs buffer length.

``python bench/core.py [--quick] [--lengths 100,10000,100000] [--gc]``

For each length: a fresh :class:`flowmem.ConversationBuffer` is prefilled
(untimed, through ``append``, one round per call) with realistic turns to the
length; then a few thousand more messages are appended one per call — user
messages, assistant turns declaring a call (OpenAI shape), tool results —
in sub-windows, the windows of all lengths interleaved so background load
hits every length alike. The figure is the median over a length's
sub-windows of (window time / messages in it); the buffer grows by the timed
messages, so the final length is printed too. The last line is the ratio of
the longest length's figure to the shortest's (goal: <= 1.5, i.e. the cost of
an append does not grow with the length of the conversation).

A round is: user, assistant declaring one call, its result, assistant answer.
One round in 25 is interrupted (the result is lost; the next user message
heals the call, MEM-3) and its result arrives late, right after that user
message (it replaces the placeholder, MEM-10); one result in 20 is re-fired
(dropped, MEM-1). GC is paused while timing unless ``--gc`` is given.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from flowmem import ConversationBuffer

Msg = dict[str, Any]


def rounds(start: int = 0) -> Iterator[list[Msg]]:
    """An endless, deterministic stream of rounds (lists of OpenAI-shaped messages)."""
    late: Msg | None = None
    n = start
    while True:
        cid = f"call_{n:08d}"
        call = {"id": cid, "type": "function",
                "function": {"name": "search", "arguments": f'{{"q": "item {n}"}}'}}
        result = {"role": "tool", "tool_call_id": cid,
                  "content": f"Found {n % 7} results for item {n}."}
        batch: list[Msg] = [{"role": "user", "content": f"Please look up item {n}."}]
        if late is not None:
            batch.append(late)
            late = None
        batch.append({"role": "assistant", "content": None, "tool_calls": [call]})
        if n % 25 == 24:  # interrupted: the result comes after the next user message
            late = result
        else:
            batch.append(result)
            if n % 20 == 7:
                batch.append(dict(result))  # re-fired
            batch.append({"role": "assistant", "content": f"Item {n}: {n % 7} results."})
        yield batch
        n += 1


def prefill(length: int) -> tuple[ConversationBuffer, Iterator[list[Msg]]]:
    """A buffer holding at least ``length`` messages, and the rest of its stream."""
    buffer = ConversationBuffer()
    stream = rounds()
    while len(buffer) < length:
        buffer.append(next(stream))
    return buffer, stream


class Subject:
    """One prefilled buffer and the rest of its message stream."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.buffer, self._stream = prefill(length)
        self._pending: list[Msg] = []
        self.figures: list[float] = []

    def feed(self, count: int) -> list[Msg]:
        while len(self._pending) < count:
            self._pending.extend(next(self._stream))
        batch = self._pending[:count]
        del self._pending[:count]
        return batch

    def window(self, count: int) -> None:
        """Append ``count`` messages one per call and record µs per message."""
        batch = self.feed(count)
        append = self.buffer.append
        started = time.perf_counter()
        for message in batch:
            append(message)
        elapsed = time.perf_counter() - started
        self.figures.append(elapsed / len(batch) * 1e6)


def measure(lengths: list[int], messages: int, windows: int,
            keep_gc: bool) -> list[Subject]:
    """Time every length, the sub-windows of all lengths interleaved.

    Interleaving spreads any background load over every length alike, so the
    ratio compares like with like.
    """
    subjects = [Subject(length) for length in lengths]
    for subject in subjects:  # warm-up, untimed
        for message in subject.feed(200):
            subject.buffer.append(message)
    per_window = max(1, messages // windows)
    gc.collect()
    if not keep_gc:
        gc.disable()
    try:
        for _ in range(windows):
            for subject in subjects:
                subject.window(per_window)
    finally:
        gc.enable()
    return subjects


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer timed appends (for a smoke run)")
    parser.add_argument("--lengths", default="100,10000,100000",
                        help="comma-separated buffer lengths (default: 100,10000,100000)")
    parser.add_argument("--messages", type=int, default=None,
                        help="timed appends per length (default 6000, --quick 1000)")
    parser.add_argument("--windows", type=int, default=None,
                        help="sub-windows per length (default 15, --quick 5)")
    parser.add_argument("--gc", action="store_true", help="leave the garbage collector on")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    messages = args.messages or (1000 if args.quick else 6000)
    windows = args.windows or (5 if args.quick else 15)

    print(f"flowmem ConversationBuffer.append, {messages} timed appends per length, "
          f"median of {windows} windows, python {sys.version.split()[0]}")
    print(f"{'length':>10}  {'µs/message':>10}  {'final length':>12}")
    results: list[float] = []
    for subject in measure(lengths, messages, windows, args.gc):
        figure = statistics.median(subject.figures)
        results.append(figure)
        print(f"{subject.length:>10,}  {figure:>10.2f}  {len(subject.buffer):>12,}")
    if len(results) >= 2:
        ratio = results[-1] / results[0]
        verdict = "ok" if ratio <= 1.5 else "ABOVE GOAL"
        print(f"ratio {lengths[-1]:,} / {lengths[0]:,}: {ratio:.2f} (goal <= 1.5: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
