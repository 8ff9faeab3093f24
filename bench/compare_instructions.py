"""Instructions per timed append in ``bench.compare``'s own harness (callgrind).

``python bench/compare_instructions.py [--lengths 100,1000,10000] [--windows 25]``

Runs ``bench/run_one.py``'s ``Trial`` for flowmem's SQLite store at
``synchronous=normal`` and for the raw sqlite3 floor at the same durability,
prepared as ``bench.compare`` prepares them (prefilled, the store reopened, the
warm-up appends), then ``--windows`` windows of appends (20 each; 10 at 100
messages) under ``valgrind --tool=callgrind``, collecting only inside the
timed appends: they run inside the builtin ``any()``, the toggle. So the counts
are the timed appends' alone, repeatable whatever the load, for the state the
harness leaves: at 100 and 1,000 messages each window appends to its own
conversation, at 10,000 all windows to one, and in both cases the appending
connection did not write the conversation. ``--prefilled`` also counts flowmem
with each connection's hot copy filled before its timing (what a connection
that wrote the conversation knows). Not a test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.callgrind import total
from bench.run_one import SHORT

FLOWMEM, FLOOR = "flowmem-sqlite-normal", "raw-sqlite-wal-normal"


def _size(length: int) -> int:
    """Appends per window: what ``bench.compare``'s paired run takes on a quiet machine
    (``Trial``'s own sizing, not its calibration under valgrind)."""
    return min(20, max(10, length // 20)) if length <= SHORT else 20


def _child(name: str, length: int, windows: int, prefilled: bool) -> None:
    from bench.run_one import Trial

    if prefilled:
        _fill_every_new_copy()
    with tempfile.TemporaryDirectory() as workdir:
        trial = Trial(name, length, Path(workdir), windows=windows, max_size=20)
        trial.convert()
        trial.prepare()
        trial.calibrate()
        trial.windows, trial.size = windows, _size(length)
        store = trial.store

        def timed(conversation: str, items: Any) -> int:
            append = store.append
            any(map(lambda item: append(conversation, item), items))  # the toggle
            return 1

        store.timed_appends = timed
        for index in range(windows):
            trial.window(index)


def _fill_every_new_copy() -> None:
    from flowmem.stores.sqlite_programs import SQLiteConversations

    started = SQLiteConversations._indexed

    def indexed(self: SQLiteConversations, key: Any, incoming: Any) -> Any:
        buffer = yield from started(self, key, incoming)
        if buffer.known is not None:
            yield from self._fill(buffer)
        return buffer

    SQLiteConversations._indexed = indexed  # type: ignore[method-assign]


def _count(name: str, length: int, windows: int, prefilled: bool) -> float:
    argv = [sys.executable, __file__, "--child", name, "--length", str(length),
            "--windows", str(windows), *(["--prefilled"] if prefilled else [])]
    return total(argv, toggle="builtin_any") / (windows * _size(length))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="100,1000,10000")
    parser.add_argument("--windows", type=int, default=25)
    parser.add_argument("--prefilled", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.length, args.windows, args.prefilled)
        return 0
    print("| messages | floor | flowmem | ratio |" + (" flowmem, copy filled | ratio |"
                                                     if args.prefilled else ""))
    print("|---:|---:|---:|---:|" + ("---:|---:|" if args.prefilled else ""))
    for length in (int(x) for x in args.lengths.split(",")):
        floor = _count(FLOOR, length, args.windows, False)
        flowmem = _count(FLOWMEM, length, args.windows, False)
        row = f"| {length:,} | {floor:,.0f} | {flowmem:,.0f} | {flowmem / floor:.2f}× |"
        if args.prefilled:
            filled = _count(FLOWMEM, length, args.windows, True)
            row += f" {filled:,.0f} | {filled / floor:.2f}× |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
