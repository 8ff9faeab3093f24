"""Instructions per SQLite append, layer by layer: what each layer of ``Memory.append`` adds.

``python bench/append_layers.py [--messages 1000] [--warmup 200]``

Runs the seeded workload (``bench/workload.py``) at ``synchronous=normal``,
one message per append on one conversation, under ``valgrind --tool=callgrind``
(``bench/callgrind.py``: instructions, repeatable whatever the load), once
per way. Each way does one layer more than the one before it, so each
difference is what that layer costs:

``loop``          the loop over the messages alone;
``canonical``     + ``canonical_messages`` (validation and the copy);
``begin-commit``  + an empty ``BEGIN IMMEDIATE`` / ``COMMIT`` from plain Python;
``within``        the same empty transaction through ``SQLiteStore._within``
                  (the write turn, the deleted-file ``stat``, the error handling);
``run-append``    ``run_append`` inside the plain ``BEGIN IMMEDIATE`` / ``COMMIT``
                  (the statements, their JSON, the plan, the hot copy);
``run-within``    ``run_append`` through ``_within``;
``store``         ``SQLiteStore.append`` (the holds, the key's stripe);
``memory``        ``Memory.append`` (the scope, the coordinator, the result).

Prints each way's instructions per message and the layer it adds. Not a test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.callgrind import per_item
from bench.workload import DEFAULT_SEED, stream

WAYS = ("loop", "canonical", "begin-commit", "within", "run-append", "run-within", "store",
        "memory")
LAYERS = {"canonical": "loop", "begin-commit": "canonical", "within": "begin-commit",
          "run-append": "begin-commit", "run-within": "run-append", "store": "run-within",
          "memory": "store"}
Append = Callable[[dict[str, Any]], Any]


def _way(name: str, path: str) -> Append:
    from flowmem import ExecutionContext
    from flowmem.memory import Memory
    from flowmem.messages import canonical_messages
    from flowmem.scopes import StorageKey
    from flowmem.stores.sqlite import SQLiteStore
    from flowmem.stores.sqlite_fast import run_append

    memory = Memory.from_url(f"sqlite:///{path}?synchronous=normal")
    store = memory.store
    assert isinstance(store, SQLiteStore)
    context, where = ExecutionContext(session_id="s"), StorageKey("session", "s", "bench")
    memory.append("session", "bench", {"role": "user", "content": "first"}, context=context)
    cursor, sql = store._local.cursor, store._programs()

    def plain(body: Callable[[], Any]) -> Any:
        cursor.execute("BEGIN IMMEDIATE")
        answer = body()
        cursor.execute("COMMIT")
        return answer

    ways: dict[str, Append] = {
        "loop": lambda message: None,
        "canonical": canonical_messages,
        "begin-commit": lambda message: (canonical_messages(message), plain(lambda: None)),
        "within": lambda message: (canonical_messages(message),
                                   store._within(lambda cursor: None)),
        "run-append": lambda message: plain(lambda: run_append(
            sql, cursor, where, canonical_messages(message), None, True, None, 0)),
        "run-within": lambda message: store._within(lambda cursor: run_append(
            sql, cursor, where, canonical_messages(message), None, True, None, 0)),
        "store": lambda message: store.append(where, canonical_messages(message),
                                              max_messages=None, lock_timeout=5.0),
        "memory": lambda message: memory.append("session", "bench", message, context=context),
    }
    return ways[name]


def _child(name: str, count: int, generate: int) -> None:
    """One way's ``count`` appends (the workload made as long as the longer run's)."""
    workload = list(islice(stream(DEFAULT_SEED), max(generate, count)))[:count]
    with tempfile.TemporaryDirectory() as workdir:
        append = _way(name, f"{workdir}/{name}.db")
        for message in workload:
            append(message)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--generate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.messages, args.generate)
        return
    total = args.warmup + args.messages
    counts: dict[str, float] = {}
    for name in WAYS:
        def command(n: int, name: str = name) -> list[str]:
            return [sys.executable, __file__, "--child", name, "--messages", str(n),
                    "--generate", str(total)]
        counts[name] = per_item(command, args.warmup, total)
        inner = LAYERS.get(name)
        added = "" if inner is None else f"  (+{counts[name] - counts[inner]:,.0f} over {inner})"
        print(f"{name:13} {counts[name]:10,.0f} instructions per message{added}", flush=True)


if __name__ == "__main__":
    main()
