#!/usr/bin/env python3
"""Generate the blocking PostgreSQL store from the asyncio one.

``src/flowmem/stores/postgres/_async.py`` is the source; this script writes
``_sync.py`` from it by token substitution, line by line (the approach of
httpcore's ``scripts/unasync.py``): a coroutine function becomes a function,
``await`` goes, a name's ``Async`` prefix goes (``AsyncPostgresStore``,
``AsyncConnectionPool``, psycopg's ``AsyncConnection``, ``_common.AsyncFace``),
and a few named pairs (``adrive``/``drive``, ``aclose``/``close``, the
``contextlib`` names). Whatever substitution cannot express lives in
``_common.py``, shared by both faces. The names of a ``from ... import`` that
a substitution changed are sorted again as ruff's isort sorts them (constants,
classes, then the rest), so the generated file passes ``ruff check``, and the
continuation lines of a line that got shorter move left with it.

    python scripts/unasync.py          # write _sync.py
    python scripts/unasync.py --check  # exit 1 (with a diff) when _sync.py is stale

Every substitution must be used at least once: one that no longer matches is
reported (and fails), so the list cannot rot.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "flowmem" / "stores" / "postgres"
SOURCE = PACKAGE / "_async.py"
TARGET = PACKAGE / "_sync.py"

HEADER = (
    "# GENERATED FILE — do not edit. Written by scripts/unasync.py from _async.py\n"
    "# (the asyncio face) by token substitution; edit _async.py or _common.py, then run\n"
    "# `python scripts/unasync.py` (`--check` fails when this file is stale).\n"
)

SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    (r"AbstractAsyncContextManager", "AbstractContextManager"),
    (r"asynccontextmanager", "contextmanager"),
    (r"Async([A-Z][A-Za-z0-9_]*)", r"\1"),
    (r"async def", "def"),
    (r"async with", "with"),
    (r"await ", ""),
    (r"adrive", "drive"),
    (r"aclose", "close"),
)
"""``(pattern, replacement)``; each pattern is matched as whole words only."""

COMPILED = [(re.compile(rf"\b{pattern}\b" if not pattern.endswith(" ") else rf"\b{pattern}"),
             replacement) for pattern, replacement in SUBSTITUTIONS]

_FROM_IMPORT = re.compile(r"^(\s*from\s+\S+\s+import\s+)(?!\()(.+?)(\s*)$")


def _brackets(line: str) -> tuple[int, int | None]:
    """How many brackets ``line`` leaves open, and the column its continuation lines align
    to (after the innermost bracket left open; ``None``: none, or a hanging indent)."""
    code = re.sub(r"'[^']*'|\"[^\"]*\"", lambda m: "_" * len(m.group()),
                  line.split("#", 1)[0].rstrip())
    stack: list[int] = []
    closed = 0
    for column, char in enumerate(code):
        if char in "([{":
            stack.append(column)
        elif char in ")]}":
            if stack:
                stack.pop()
            else:
                closed += 1
    if not stack or stack[-1] == len(code) - 1:
        return len(stack) - closed, None
    return len(stack) - closed, stack[-1] + 1


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's isort order of imported names (order-by-type): CONSTANTS, Classes, others."""
    bare = name.split(" as ")[0]
    if bare.isupper() and len(bare) > 1:
        return 0, bare
    if bare[:1].isupper():
        return 1, bare
    return 2, bare


def unasync_lines(lines: list[str], used: set[int]) -> list[str]:
    out: list[str] = []
    changed_import: list[int] = []  # indexes in out of lines inside an import whose names changed
    in_block: list[int] | None = None  # indexes of the names of a parenthesized import
    block_changed = False
    dedent, depth = 0, 0  # continuation lines of a shortened line move left with it
    for line in lines:
        new = line
        for index, (pattern, replacement) in enumerate(COMPILED):
            after = pattern.sub(replacement, new)
            if after != new:
                used.add(index)
                new = after
        if depth > 0 and dedent:
            spaces = len(new) - len(new.lstrip(" "))
            new = new[min(dedent, spaces):]
        opened, aligned = _brackets(new)
        if depth == 0:
            before = _brackets(line)[1]
            dedent = before - aligned if aligned is not None and before is not None else 0
        depth = max(depth + opened, 0)
        out.append(new)
        stripped = new.strip()
        if in_block is not None:
            if stripped == ")":
                if block_changed:
                    _sort_block(out, in_block)
                in_block = None
            else:
                in_block.append(len(out) - 1)
                block_changed = block_changed or new != line
            continue
        if re.match(r"^\s*from\s+\S+\s+import\s+\($", new):
            in_block, block_changed = [], False
        elif new != line and _FROM_IMPORT.match(new):
            changed_import.append(len(out) - 1)
    for index in changed_import:
        match = _FROM_IMPORT.match(out[index])
        assert match is not None
        names = sorted((name.strip() for name in match.group(2).split(",")), key=_isort_key)
        out[index] = f"{match.group(1)}{', '.join(names)}{match.group(3)}"
    return out


def _sort_block(out: list[str], indexes: list[int]) -> None:
    """Sort the one-name-per-line body of a parenthesized ``from ... import (``."""
    names = [out[i].strip().rstrip(",") for i in indexes]
    indent = out[indexes[0]][: len(out[indexes[0]]) - len(out[indexes[0]].lstrip())]
    for i, name in zip(indexes, sorted(names, key=_isort_key), strict=True):
        out[i] = f"{indent}{name},\n"


def generate() -> tuple[str, list[tuple[str, str]]]:
    """The text ``_sync.py`` should hold, and the substitutions that matched nothing."""
    used: set[int] = set()
    body = unasync_lines(SOURCE.read_text(encoding="utf-8").splitlines(keepends=True), used)
    unused = [SUBSTITUTIONS[i] for i in range(len(SUBSTITUTIONS)) if i not in used]
    return HEADER + "".join(body), unused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 when _sync.py differs from what it would be")
    args = parser.parse_args(argv)
    expected, unused = generate()
    if unused:
        print(f"unasync: substitutions that matched nothing: {unused}", file=sys.stderr)
        return 1
    relative = TARGET.relative_to(ROOT)
    if args.check:
        actual = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if actual != expected:
            sys.stdout.writelines(difflib.unified_diff(
                actual.splitlines(keepends=True), expected.splitlines(keepends=True),
                f"{relative} (checked in)", f"{relative} (generated)"))
            print(f"unasync: {relative} is stale; run `python scripts/unasync.py`",
                  file=sys.stderr)
            return 1
        print(f"unasync: {relative} is up to date")
        return 0
    TARGET.write_text(expected, encoding="utf-8")
    print(f"unasync: wrote {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
