"""The sans-I/O protocol of the SQL stores' programs, and the drivers that run them.

A *program* is a generator that yields one step at a time and receives its
answer:

- a :data:`Statement` ``(sql, params)`` (``?`` placeholders) is answered by
  its rows;
- a :class:`Batch` of statements whose rows the program needs only together
  is answered by the list of their rows, in order. A driver may send a batch
  at once (PostgreSQL pipelines it: one network round trip) or run it
  statement by statement (SQLite).

The same program runs on a blocking connection (:func:`drive`) and on an
asyncio one (:func:`adrive`), so the SQL logic exists once for both faces of
the coordinator. A driver with a faster way to run a batch passes it as
``batch``.

Bodies are JSON text with every non-ASCII code point escaped
(:func:`encode`), so NUL and lone surrogates round-trip the same way on
every backend.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "AsyncExecute",
    "AsyncRunBatch",
    "Batch",
    "Execute",
    "Program",
    "Rows",
    "RunBatch",
    "Statement",
    "Step",
    "T",
    "adrive",
    "drive",
    "resumed",
]

T = TypeVar("T")
Rows = list[tuple[Any, ...]]
Statement = tuple[str, Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Batch:
    """Statements run in order whose rows the program needs only together.

    ``final``: the program yields nothing after this batch, and every way its
    statements could differ from what the program planned is an error of one
    of them (a plain ``INSERT`` refused by a unique key, a ``NULL`` refused by
    ``NOT NULL``), never a silent difference in their rows. A driver may then
    send ``COMMIT`` with the batch: an error aborts the rest of the batch and
    the ``COMMIT`` with it.
    """

    statements: tuple[Statement, ...]
    final: bool = False


Step = Statement | Batch
Program = Generator[Step, Any, T]
"""A SQL program: yields a :data:`Statement` (answered by its rows) or a :class:`Batch`
(answered by the list of its statements' rows)."""

Execute = Callable[[str, Sequence[Any]], Rows]
"""Runs one statement in the current transaction; returns its rows."""

AsyncExecute = Callable[[str, Sequence[Any]], Awaitable[Rows]]
"""The asyncio twin of :data:`Execute`."""

RunBatch = Callable[[Batch], list[Rows]]
"""Runs a batch in the current transaction; returns the rows of each statement."""

AsyncRunBatch = Callable[[Batch], Awaitable[list[Rows]]]
"""The asyncio twin of :data:`RunBatch`."""


def drive(program: Program[T], execute: Execute, batch: RunBatch | None = None) -> T:
    """Run ``program`` to completion on a blocking connection (a batch statement by
    statement unless ``batch`` is given)."""
    try:
        step = next(program)
        while True:
            if not isinstance(step, Batch):
                answer: Any = execute(*step)
            elif batch is not None:
                answer = batch(step)
            else:
                answer = [execute(*statement) for statement in step.statements]
            step = program.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        program.close()


async def adrive(program: Program[T], execute: AsyncExecute,
                 batch: AsyncRunBatch | None = None) -> T:
    """Run ``program`` to completion on an asyncio connection."""
    try:
        step = next(program)
        while True:
            if not isinstance(step, Batch):
                answer: Any = await execute(*step)
            elif batch is not None:
                answer = await batch(step)
            else:
                answer = [await execute(*statement) for statement in step.statements]
            step = program.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        program.close()


def resumed(program: Program[T], answer: Any) -> Program[T]:
    """``program``, whose first step was taken and is answered by ``answer``, on from
    there (a program may send another's first step with its own)."""
    try:
        step = program.send(answer)
        while True:
            step = program.send((yield step))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
