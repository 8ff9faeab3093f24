"""Render one comparison run (``benchmarks.json``): README.md's table and ``benchmarks.md``.

Each figure appears once: README.md shows every contender of :data:`README_ROWS`
at 10,000 messages; ``benchmarks.md`` shows the other lengths, the other
contenders, the reads, memory, disk and the interleaved ratios, and writes
"README" where a cell would repeat one of the README's figures.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ._common import table

AT = 10_000  # the length README.md shows
README_ROWS = {  # contender -> its README label, in table order
    "flowmem-memory": "flowmem `memory://`",
    "flowmem-sqlite-full": "flowmem `sqlite://` (default)",
    "flowmem-postgres": "flowmem `postgresql://`",
    "flowmem-redis": "flowmem `redis://`",
    "agents-sqlitesession": "OpenAI Agents SDK `SQLiteSession`",
    "langchain-sql": "LangChain `SQLChatMessageHistory`",
    "langgraph-add-messages": "LangGraph `add_messages` (in memory)",
    "json-blob": "JSON blob rewritten per append",
    "langgraph-sqlitesaver": "LangGraph `StateGraph` + `SqliteSaver`",
    "raw-sqlite-wal-full": "floor: raw sqlite3, WAL + FULL",
}
BASE = "flowmem-sqlite-full"
SEE = "README"
START, END = "<!-- bench:table:start -->", "<!-- bench:table:end -->"


def _sig(value: float) -> str:
    """Three significant figures, thousands separated: 0.76, 7.74, 151, 1,260, 460,500."""
    rounded = float(f"{value:.3g}")
    if rounded >= 1000:
        return f"{rounded:,.0f}"
    return f"{rounded:.2f}" if rounded < 1 else f"{rounded:.{3 - len(str(int(rounded)))}f}"


def _us(value: float | None) -> str:
    if value is None:
        return "—"
    return (f"{_sig(value)} µs" if value < 1000 else f"{_sig(value / 1000)} ms" if value < 1e6
            else f"{_sig(value / 1e6)} s")


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"×{_sig(value)}"


class Run:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.lengths: list[int] = data["lengths"]
        self.contenders: dict[str, dict[str, Any]] = data["contenders"]
        self.results = {(r["contender"], r["length"]): r for r in data["results"]}
        self.pairs = [p for p in data.get("paired", []) if p.get("status") == "ok"]

    def ok(self, name: str, length: int) -> dict[str, Any] | None:
        result = self.results.get((name, length))
        return result if result and result.get("status") == "ok" else None

    def us(self, name: str, length: int) -> float | None:
        return (self.ok(name, length) or {}).get("us_per_msg")

    def shown(self, name: str, length: int) -> bool:
        return length == AT and name in README_ROWS

    def cell(self, name: str, length: int, text: Any = None, readme: bool = False) -> str:
        if (text is None or readme) and self.shown(name, length):
            return SEE
        result = self.results.get((name, length))
        status = result.get("status") if result else None
        if status == "ok":
            return _us(result["us_per_msg"]) if text is None else text(result)
        return {None: "—", "skipped": "skipped¹", "unavailable": "n/a²"}.get(status, "error³")

    def label(self, name: str) -> str:
        return self.contenders.get(name, {}).get("label", name)

    def measured(self) -> list[str]:
        return [n for n in self.contenders if any(self.ok(n, x) for x in self.lengths)]

    def pair(self, kind: str, first: str, length: int) -> dict[str, Any] | None:
        return next((p for p in self.pairs
                     if p.get("kind") == kind and p["paired"][0] == f"{first}@{length}"), None)

    def readme_ratio(self, name: str) -> tuple[float | None, dict[str, Any] | None]:
        """The ÷ flowmem ``sqlite://`` README shows, and the interleaved pair it came from."""
        if name == BASE:
            return 1.0, None
        info = self.contenders.get(name, {})
        if info.get("kind") == "floor":
            floor = self.pair("floor", BASE, AT)
            if floor:
                return 1 / floor["ratio_median"], floor
        elif info.get("kind") != "peer" or info.get("reference") != BASE:
            return None, None
        peer = self.pair("peer", name, AT)
        if peer:
            return peer["ratio_median"], peer
        mine, base = self.us(name, AT), self.us(BASE, AT)
        return (mine / base if mine and base else None), None


def _sendable(result: dict[str, Any]) -> str:
    s = result["sendability"]
    return f"{'✅' if s['sendable'] else '✗'} {s['duplicates']} / {s['dangling']} / {s['orphans']}"


def readme_table(data: dict[str, Any]) -> str:
    """README.md's table: every :data:`README_ROWS` contender at 10,000 messages."""
    run = Run(data)
    rows = []
    for name, label in README_ROWS.items():
        if name not in run.contenders:
            continue
        result = run.ok(name, AT)
        ratio, _ = run.readme_ratio(name)
        rows.append([label, _sig(result["us_per_msg"]) if result else run.cell(name, 0),
                     "1" if name == BASE else _ratio(ratio) if ratio else "",
                     _sendable(result) if result else "—"])
    m = data["machine"]
    servers = "; ".join(f"{k} {v}" for k, v in m.get("servers", {}).items())
    return (table(["contender", "µs per appended message", "÷ flowmem `sqlite://`",
                   "history sendable (duplicates / dangling / orphans)"], rows, "lrrl")
            + f"\n\nMeasured {m['date']} on {m['cores']} cores ({m['cpu']}, {m['ram_gib']} GiB), "
            f"Python {m['python']}, SQLite {m['sqlite']}; {servers}"
            + (" (a `--quick` smoke run)" if data.get("quick") else "") + ".")


def splice_readme(data: dict[str, Any], readme: Path) -> None:
    """Replace what stands between README.md's bench markers with :func:`readme_table`."""
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{readme}: no {START} ... {END} markers")
    new = f"{START}\n{readme_table(data)}\n{END}"
    readme.write_text(pattern.sub(lambda _: new, text, count=1), encoding="utf-8")


def _append_tables(run: Run) -> str:
    lengths = run.lengths
    rows = []
    for name, info in run.contenders.items():
        points = [v for x in lengths if (v := run.us(name, x))]
        growth = _ratio(points[-1] / points[0]) if len(points) > 1 else "—"
        rows.append([info["label"], info["durability"],
                     *[run.cell(name, x) for x in lengths], growth])
    absolute = table(["contender", "journal, synchronous", *[f"{x:,}" for x in lengths],
                      "longest ÷ shortest"], rows, "ll" + "r" * (len(lengths) + 1))
    rows = []
    for name, info in run.contenders.items():
        against = info["floor"] if info["kind"] == "flowmem" else info["reference"]
        if info["kind"] == "floor" or against not in run.contenders:
            continue
        cells = []
        for x in lengths:
            mine, theirs = run.us(name, x), run.us(against, x)
            cells.append(SEE if run.shown(name, x) and run.readme_ratio(name)[0] else
                         _ratio(mine / theirs) if mine and theirs else "—")
        rows.append([info["label"], run.label(against), *cells])
    ratios = table(["contender", "÷", *[f"{x:,}" for x in lengths]], rows,
                   "ll" + "r" * len(lengths))
    return (f"{absolute}\n\nThe same isolated runs divided: a peer by the flowmem store "
            f"it is compared with, a flowmem store by its floor at the same durability.\n\n"
            f"{ratios}")


def _paired_table(run: Run) -> str:
    used = {id(run.readme_ratio(name)[1]) for name in README_ROWS}
    rows = []
    for pair in run.data.get("paired", []):
        (a, la), (b, lb) = (spec.rpartition("@")[::2] for spec in pair["paired"])
        what = (f"{run.label(a)}: at {int(la):,} ÷ at {int(lb):,}" if a == b
                else f"{run.label(a)} ÷ {run.label(b)}, at {int(la):,}")
        if pair.get("status") != "ok":
            rows.append([what, "—", "—", f"{pair.get('status')}: {pair.get('reason', '')}", "—"])
            continue
        ratios = sorted(pair["ratios"])
        q = len(ratios) // 4
        rows.append([what, *(_us(pair["us_per_msg"][s]) for s in pair["paired"]),
                     SEE if id(pair) in used else f"**{pair['ratio_median']:.2f}**",
                     f"{ratios[q]:.2f}–{ratios[-1 - q]:.2f} ({pair['windows']} pairs)"])
    return table(["A ÷ B", "A", "B", "ratio (median)", "middle half of the pairs"], rows)


def _reads_and_memory(run: Run) -> tuple[str, str]:
    long = [x for x in run.lengths if x >= 1_000] or run.lengths
    rows = [[run.label(n), *[run.cell(n, x, lambda r: _us(r["read_all_ms"] * 1000)) for x in long],
             *[run.cell(n, x, lambda r: _us(r["read_last50_us"])) for x in long]]
            for n in run.measured()]
    reads = table(["contender", *[f"full read @ {x:,}" for x in long],
                   *[f"last 50 @ {x:,}" for x in long]], rows)

    def disk(result: dict[str, Any]) -> str:
        size = result.get("disk_bytes")
        return "—" if size is None else f"{size / 1e6:.1f} MB ({size / result['length']:.0f} B/msg)"

    def rss(result: dict[str, Any]) -> str:
        return "—" if result.get("own_rss_mb") is None else f"{result['own_rss_mb']:.0f} MB"

    rows = [[run.label(n), *[run.cell(n, x, f) for x in long for f in (rss, disk)]]
            for n in run.measured()]
    memory = table(["contender", *[f"{what} @ {x:,}" for x in long
                                   for what in ("own RSS", "disk")]], rows)
    return reads, memory


def _notes(run: Run) -> str:
    lines = []
    for name, info in run.contenders.items():
        text = f"- **{info['label']}** (`{name}`) — {info['durability']}. {info['notes']}"
        if info.get("max_length") and info.get("max_length_reason"):
            text += f" Measured up to {info['max_length']:,} messages: {info['max_length_reason']}."
        lines.append(text.rstrip())
    problems = [f"- {run.label(r['contender'])} at {r['length']:,}: {r.get('status')} — "
                f"{r.get('reason', '')}" for r in run.data["results"] if r.get("status") != "ok"]
    return "\n".join(lines) + "\n\n## Not measured\n\n" + ("\n".join(problems) or "- none")


def _workload(run: Run) -> str:
    for length in sorted(run.lengths, key=lambda x: (x != AT, -x)):
        for name in run.measured():
            if (result := run.ok(name, length)) and "workload" in result:
                w = result["workload"]
                return (f"At {length:,} messages (with the turn in flight completed: "
                        f"{w['messages']:,} messages, {w['calls']:,} tool calls) the workload "
                        f"holds {w['refired']} re-fired results, {w['unanswered_calls']} "
                        f"interrupted calls and {w['late_results']} late results.")
    return ""


def render(data: dict[str, Any], out: Path) -> None:
    """Write ``benchmarks.md`` into ``out``."""
    run = Run(data)
    m = data["machine"]
    reads, memory = _reads_and_memory(run)
    machine = table(["", ""], [
        ["date", m["date"]], ["cores", f"{m['cores']} ({m['cpu']}), {m['ram_gib']} GiB"],
        ["Python, SQLite", f"{m['python']}, {m['sqlite']} (default synchronous: "
         f"{m['sqlite_defaults']})"], ["platform", m["platform"]],
        ["servers", "; ".join(f"{k} {v}" for k, v in m.get("servers", {}).items())],
        ["packages", ", ".join(f"{k} {v}" for k, v in m["packages"].items())],
        ["whole run", f"{data['elapsed_s'] / 60:.1f} min"
         + (" (`--quick`: fewer lengths and windows)" if data.get("quick") else "")]], "ll")
    sendability = table(["contender", *[f"{x:,}" for x in run.lengths]],
                        [[run.label(n), *[run.cell(n, x, _sendable, True) for x in run.lengths]]
                         for n in run.measured()])
    text = f"""# Benchmarks: flowmem next to what users would otherwise pick

Generated by `python -m bench.compare` from `benchmarks.json`; do not edit by hand.
`python -m bench.compare --render-only` rewrites this page and the README's
table from that file. The table at 10,000 messages is in the
[README](../README.md#benchmark); a cell here that would repeat one of its
figures says "{SEE}". The method is in `bench/run_one.py`, the workload in
`bench/workload.py`, each contender's adapter in `bench/contenders/`.

The machine has 2 shared cores and a virtual disk whose fsync latency swings
by 10× from one minute to the next: compare ratios from one run (best the
interleaved ones), not absolute times.

{machine}

## Append cost

µs per appended message, one message per append call (one transaction, one
invoke), measured at the given length: the store is prefilled to it untimed,
then timed in windows of appends; the figure is the median over the windows.

{_append_tables(run)}

¹ not measured at this length (reason below) · ² not available on this
machine · ³ failed (reason below).

### Interleaved ratios

Two trials in one process with their windows alternating (A B, B A, …), so
both see the same disk and CPU weather: flowmem's SQLite store against the
raw floor at the same durability, each flowmem store at its longest length
against itself at the shortest, the SQLite peers against flowmem. The ratio
is the median of the per-pair ratios.

{_paired_table(run)}

## Reads

Full read = the whole conversation; last 50 = the newest 50 messages through
the contender's cheapest API for it (none: a full read and a slice).

{reads}

## Memory and disk

Own RSS = the process's peak resident memory, less what it held once the
workload was generated (so what the contender added, a full read included).
Disk = the store's directory holding one conversation of that length.

{memory}

## Is the stored history sendable?

At the moment a runtime sends a history (the turn in flight completed, the
next user message appended) each history is read back as OpenAI Chat dicts
and counted by `bench/sendability.py`: duplicates (a result whose call was
already answered) / dangling calls / orphan results. ✅ = flowmem's own
`sendability_problems` finds nothing. {_workload(run)}

{sendability}

## The contenders

Each peer runs at its own default durability, found by reading its code:
LangGraph's `SqliteSaver.setup` and the Agents SDK's `SQLiteSession` set
`journal_mode=WAL` only; LangChain's `SQLChatMessageHistory` (through
SQLAlchemy) sets neither; SQLite's default `synchronous` is FULL. flowmem
opens WAL with `synchronous=FULL` unless the URL says `?synchronous=normal`.

{_notes(run)}
"""
    (out / "benchmarks.md").write_text(text, encoding="utf-8")
