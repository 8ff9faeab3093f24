"""Render a comparison run (``benchmarks.json``) as ``benchmarks.md`` and a log-log plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["render"]

PLOT = "benchmarks-append.png"

# What issue #6 quotes for the peers at 10,000 messages (µs per appended message).
QUOTED_AT_10K = {
    "langgraph-sqlitesaver": 105_000.0,
    "json-blob": 58_000.0,
    "langgraph-add-messages": 870.0,
    "langchain-sql": 650.0,
    "agents-sqlitesession": 220.0,
    "raw-sqlite-wal-normal": 15.0,
}
FLAT_GOAL = 1.5
FLOOR_GOAL = 2.0
MEMORY_GOAL_US = 12.0  # issue #14 (it was 20 in issue #6)


def _us(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if value < 10:
        return f"{value:.2f} µs"
    if value < 1000:
        return f"{value:.1f} µs"
    if value < 10_000:
        return f"{value / 1000:.2f} ms"
    if value < 1_000_000:
        return f"{value / 1000:.1f} ms"
    return f"{value / 1e6:.2f} s"


def _ms(value: float | None) -> str:
    return "—" if value is None else _us(value * 1000)


def _bytes(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


def _ratio(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"×{value:.0f}"
    return f"×{value:.1f}" if value >= 10 else f"×{value:.2f}" if value >= 0.1 else \
        f"×{value:.3f}"


def _length(value: int) -> str:
    return f"{value:,}"


class _Run:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.lengths: list[int] = data["lengths"]
        self.contenders: dict[str, dict[str, Any]] = data["contenders"]
        self.results: dict[tuple[str, int], dict[str, Any]] = {
            (r["contender"], r["length"]): r for r in data["results"]}

    def ok(self, name: str, length: int) -> dict[str, Any] | None:
        result = self.results.get((name, length))
        return result if result and result.get("status") == "ok" else None

    def us(self, name: str, length: int) -> float | None:
        result = self.ok(name, length)
        return result["us_per_msg"] if result else None

    def cell(self, name: str, length: int, value: Any = None) -> str:
        result = self.results.get((name, length))
        if result is None:
            return "—"
        status = result.get("status")
        if status == "ok":
            return _us(result["us_per_msg"]) if value is None else value
        if status == "skipped":
            return "skipped¹"
        if status == "unavailable":
            return "n/a²"
        return "error³"

    def names(self) -> list[str]:
        return list(self.contenders)

    def measured(self) -> list[str]:
        return [n for n in self.names() if any(self.ok(n, length) for length in self.lengths)]


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    aligns = align or "l" + "r" * (len(header) - 1)
    marks = ["---:" if a == "r" else ":---:" if a == "c" else "---" for a in aligns]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _append_tables(run: _Run) -> tuple[str, str]:
    lengths = run.lengths
    rows = []
    for name in run.names():
        info = run.contenders[name]
        first, last = run.us(name, lengths[0]), run.us(name, 10_000)
        growth = _ratio(last / first) if first and last else "—"
        rows.append([info["label"], info["durability"],
                     *[run.cell(name, length) for length in lengths], growth])
    header = ["contender", "journal, synchronous", *[_length(x) for x in lengths],
              f"10,000 ÷ {lengths[0]:,}"]
    absolute = _table(header, rows, "ll" + "r" * (len(lengths) + 1))

    ratio_rows = []
    for name in run.names():
        info = run.contenders[name]
        if info["kind"] == "floor":
            continue  # shown the other way round: flowmem ÷ its floor
        against = info["floor"] if info["kind"] == "flowmem" else info["reference"]
        if not against or against not in run.contenders or name not in run.measured():
            continue
        cells = []
        for length in lengths:
            mine, theirs = run.us(name, length), run.us(against, length)
            cells.append(_ratio(mine / theirs) if mine and theirs else "—")
        ratio_rows.append([info["label"], run.contenders[against]["label"], *cells])
    ratios = _table(["contender", "÷ (same run, same durability)",
                     *[_length(x) for x in lengths]], ratio_rows,
                    "ll" + "r" * len(lengths))
    return absolute, ratios


def _spec(run: _Run, spec: str) -> tuple[str, int]:
    name, _, length = spec.partition("@")
    return run.contenders.get(name, {}).get("label", name), int(length)


def _pair_label(run: _Run, pair: dict[str, Any]) -> str:
    (a_label, a_length), (b_label, b_length) = (_spec(run, x) for x in pair["paired"])
    if pair.get("kind") == "flat":
        return f"{a_label}: at {_length(a_length)} ÷ at {_length(b_length)}"
    return f"{a_label} ÷ {b_label}, at {_length(a_length)}"


def _paired_table(run: _Run) -> str:
    rows = []
    titles = {"floor": "flowmem ÷ raw floor, same durability", "flat": "flat curve",
              "peer": "peer ÷ flowmem, same synchronous"}
    for pair in run.data.get("paired", []):
        first, second = pair["paired"]
        what = titles.get(pair.get("kind", ""), pair.get("kind", ""))
        if pair.get("status") != "ok":
            rows.append([what, _pair_label(run, pair), "—", "—",
                         f"{pair.get('status')}: {pair.get('reason', '')}", "—"])
            continue
        ratios = sorted(pair["ratios"])
        quarter = len(ratios) // 4
        spread = f"{ratios[quarter]:.2f}–{ratios[-1 - quarter]:.2f}"
        rows.append([what, _pair_label(run, pair), _us(pair["us_per_msg"][first]),
                     _us(pair["us_per_msg"][second]), f"**{pair['ratio_median']:.2f}**",
                     f"{spread} ({pair['windows']} pairs)"])
    return _table(["what", "A ÷ B", "A", "B", "ratio (median)",
                   "middle half of the window ratios"], rows, "llrrrr")


def _reads_table(run: _Run) -> str:
    lengths = [x for x in run.lengths if x >= 1_000] or run.lengths
    rows = []
    for name in run.measured():
        cells_full, cells_last = [], []
        for length in lengths:
            result = run.ok(name, length)
            cells_full.append(_ms(result["read_all_ms"]) if result else run.cell(name, length))
            cells_last.append(_us(result["read_last50_us"]) if result
                              else run.cell(name, length))
        rows.append([run.contenders[name]["label"], *cells_full, *cells_last])
    header = ["contender", *[f"full read @ {_length(x)}" for x in lengths],
              *[f"last 50 @ {_length(x)}" for x in lengths]]
    return _table(header, rows)


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} MB"


def _memory_table(run: _Run) -> str:
    lengths = [x for x in run.lengths if x >= 10_000] or run.lengths[-1:]
    rows = []
    for name in run.measured():
        cells = []
        for length in lengths:
            result = run.ok(name, length)
            if not result:
                cells += [run.cell(name, length)] * 4
                continue
            cells += [_mb(result.get("own_rss_append_mb")), _mb(result.get("own_rss_mb")),
                      _mb(result.get("peak_rss_mb"))]
            disk = result.get("disk_bytes")
            text = (f"{_bytes(disk)} ({disk / length:.0f} B/msg)" if disk is not None
                    else "in memory" if not run.contenders[name]["persistent"] else "—")
            if result.get("disk_bytes_if_built_per_message"):
                text += (f"; ≈ {_bytes(result['disk_bytes_if_built_per_message'])} if built "
                         "one invoke per message⁴")
            cells.append(text)
        rows.append([run.contenders[name]["label"], *cells])
    header = ["contender"]
    for length in lengths:
        header += [f"own RSS, appending @ {_length(length)}",
                   f"own RSS, with a full read @ {_length(length)}",
                   f"process peak @ {_length(length)}", f"disk @ {_length(length)}"]
    return _table(header, rows)


def _sendability_table(run: _Run) -> str:
    rows = []
    for name in run.measured():
        cells = []
        for length in run.lengths:
            result = run.ok(name, length)
            if not result:
                cells.append(run.cell(name, length))
                continue
            s = result["sendability"]
            mark = "✅" if s["sendable"] else "❌"
            cells.append(f"{mark} {s['duplicates']} / {s['dangling']} / {s['orphans']}"
                         + (f" (healed {s['healed']})" if s["healed"] else ""))
        rows.append([run.contenders[name]["label"], *cells])
    return _table(["contender", *[_length(x) for x in run.lengths]], rows)


def _workload_line(run: _Run) -> str:
    for length in (10_000, *run.lengths[::-1]):
        for name in run.measured():
            result = run.ok(name, length)
            if result and "workload" in result:
                w = result["workload"]
                return (f"At {_length(length)} messages (as sent, with the turn in flight "
                        f"completed: {w['messages']:,} messages, {w['user_turns']:,} user turns, "
                        f"{w['calls']:,} tool calls) the workload holds **{w['refired']} "
                        f"re-fired results**, **{w['unanswered_calls']} interrupted calls** "
                        f"and **{w['late_results']} late results**: a store that keeps every "
                        "message as it came shows about those numbers as duplicates, dangling "
                        "calls and orphans.")
    return ""


def _goals(run: _Run) -> str:
    rows = []
    flowmem = [n for n in run.measured() if run.contenders[n]["kind"] == "flowmem"]
    pairs = [p for p in run.data.get("paired", []) if p.get("status") == "ok"]
    first = run.lengths[0]
    for name in flowmem:
        flat = [p for p in pairs if p.get("kind") == "flat"
                and p["paired"][0].partition("@")[0] == name]
        a, b = run.us(name, first), run.us(name, 10_000)
        isolated = f"; isolated runs: {b / a:.2f}" if a and b else ""
        if flat:
            value = flat[0]["ratio_median"]
            (_, long), (_, short) = (_spec(run, x) for x in flat[0]["paired"])
            rows.append([f"flat curve: {run.contenders[name]['label']}, at {_length(long)} "
                         f"÷ at {_length(short)} ≤ {FLAT_GOAL}",
                         f"{value:.2f} (interleaved){isolated}",
                         "✅" if value <= FLAT_GOAL else "❌"])
        elif a and b:
            rows.append([f"flat curve: {run.contenders[name]['label']} at 10,000 ÷ "
                         f"{first:,} ≤ {FLAT_GOAL}", f"{b / a:.2f} (isolated runs)",
                         "✅" if b / a <= FLAT_GOAL else "❌"])
    for pair in pairs:
        if pair.get("kind") == "floor":
            label, length = _spec(run, pair["paired"][0])
            rows.append([f"{label} ≤ {FLOOR_GOAL}× the raw floor at the same durability, "
                         f"{_length(length)}", f"{pair['ratio_median']:.2f} (interleaved)",
                         "✅" if pair["ratio_median"] <= FLOOR_GOAL else "❌"])
    if "flowmem-memory" in run.contenders:
        values = [(x, run.us("flowmem-memory", x)) for x in run.lengths]
        measured = [(x, v) for x, v in values if v is not None]
        if measured:
            worst = max(v for _, v in measured)
            rows.append([f"memory:// ≤ {MEMORY_GOAL_US:.0f} µs per message at every length",
                         ", ".join(f"{_length(x)}: {_us(v)}" for x, v in measured),
                         "✅" if worst <= MEMORY_GOAL_US else "❌"])
    bad = []
    checked = 0
    for name in flowmem:
        for length in run.lengths:
            result = run.ok(name, length)
            if result:
                checked += 1
                s = result["sendability"]
                if not s["sendable"] or s["duplicates"] or s["dangling"]:
                    bad.append(f"{name} @ {length}")
    rows.append(["every flowmem history sendable, 0 duplicates, 0 dangling calls",
                 f"{checked - len(bad)} of {checked} histories" + (
                     f" (not: {', '.join(bad)})" if bad else ""), "✅" if not bad else "❌"])
    goals = _table(["goal (issues #6, #14)", "measured", "met"], rows, "lrc")
    normal = [p for p in pairs if p.get("kind") == "floor"
              and p["paired"][0].startswith("flowmem-sqlite-normal@")]
    if normal:
        pair = max(normal, key=lambda p: _spec(run, p["paired"][0])[1])
        a, b = (pair["us_per_msg"][x] for x in pair["paired"])
        goals += (f"\n\nWhere the SQLite ratios come from: at `synchronous=NORMAL` (no fsync "
                  f"per commit) flowmem's append costs {_us(a - b)} more than the raw floor's "
                  f"one INSERT (interleaved, {_length(_spec(run, pair['paired'][0])[1])} "
                  "messages): the rule work and the extra statements of an append, all CPU. "
                  "At FULL both add the same fsync, so the FULL ratio is "
                  "(fsync + that overhead) ÷ (fsync + the floor's own CPU): near 1 on a slow "
                  "disk, several times on a disk that acknowledges an fsync in 100 µs.")

    quoted = []
    for name, value in QUOTED_AT_10K.items():
        if name not in run.contenders:
            continue
        mine = run.us(name, 10_000)
        quoted.append([run.contenders[name]["label"], _us(value), _us(mine) if mine else
                       run.cell(name, 10_000)])
    return goals + "\n\nThe peers at 10,000 messages, as the issue quotes them and as measured " \
        "here:\n\n" + _table(["contender", "issue #6 quotes", "measured here"], quoted)


def _notes(run: _Run) -> str:
    parts = []
    for name in run.names():
        info = run.contenders[name]
        text = f"- **{info['label']}** (`{name}`) — {info['durability']}."
        if info["notes"]:
            text += " " + info["notes"]
        if info.get("max_length") and info.get("max_length_reason"):
            text += (f" Measured up to {_length(info['max_length'])} messages: "
                     f"{info['max_length_reason']}.")
        parts.append(text)
    return "\n".join(parts)


def _problems(run: _Run) -> str:
    lines = []
    for result in run.data["results"]:
        if result.get("status") != "ok":
            label = run.contenders.get(result["contender"], {}).get("label", result["contender"])
            lines.append(f"- {label} at {_length(result['length'])}: "
                         f"{result.get('status')} — {result.get('reason', '')}")
    return "\n".join(lines) if lines else "- none"


def _machine(run: _Run) -> str:
    m = run.data["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    servers = "; ".join(f"{k} {v}" for k, v in m.get("servers", {}).items())
    return _table(["", ""], [
        ["date", m["date"]],
        ["flowmem commit", f"`{m['commit']}`"],
        ["cores", f"{m['cores']} ({m['cpu']})"],
        ["RAM", f"{m['ram_gib']} GiB"],
        ["Python", m["python"]],
        ["SQLite (Python's sqlite3)", m["sqlite"] + (
            f"; its default synchronous: {m['sqlite_defaults']}" if m.get("sqlite_defaults")
            else "")],
        ["platform", m["platform"]],
        ["servers", servers],
        ["packages", packages],
        ["whole run", f"{run.data['elapsed_s'] / 60:.1f} min"
         + (" (--quick)" if run.data.get("quick") else "")],
    ], "ll")


def _plot(run: _Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6.2), dpi=110)
    styles = {"flowmem": {"linewidth": 2.6, "linestyle": "-", "marker": "o"},
              "peer": {"linewidth": 1.6, "linestyle": "--", "marker": "s"},
              "floor": {"linewidth": 1.2, "linestyle": ":", "marker": "^"}}
    palette = plt.get_cmap("tab20").colors
    for index, name in enumerate(run.measured()):
        info = run.contenders[name]
        points = [(x, run.us(name, x)) for x in run.lengths if run.us(name, x)]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, label=info["label"], color=palette[(index * 2) % 20 + index // 10],
                **styles.get(info["kind"], styles["peer"]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(run.lengths, [_length(x) for x in run.lengths])
    ax.set_xlabel("conversation length (messages)")
    ax.set_ylabel("µs per appended message (median of windows)")
    ax.set_title("Append cost against conversation length (one run, same workload)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render(data: dict[str, Any], out: Path) -> None:
    """Write ``benchmarks.md`` and the plot into ``out``."""
    run = _Run(data)
    _plot(run, out / PLOT)
    absolute, ratios = _append_tables(run)
    quick = " (a `--quick` smoke run: fewer lengths and windows)" if data.get("quick") else ""
    text = f"""# Benchmarks: flowmem next to what users would otherwise pick

Generated by `python -m bench.compare` on {data['machine']['date']}{quick}; do not edit by
hand — rerun it (`pip install -e '.[bench]'` first; `--quick` for a smoke run,
`--render-only` to rewrite this page from `benchmarks.json`). The method is in
`bench/run_one.py`, the workload in `bench/workload.py`, each contender's
adapter in `bench/contenders/`.

**Noise caveat.** The machine has 2 cores and is shared: other test suites and
benchmarks ran on it during this run, and fsync latency on its virtual disk
swings by 10× from one minute to the next. Compare **ratios from the same run**
(and, for flowmem against the raw floor, the interleaved ratios below), not
absolute times; absolute figures will differ on your machine.

## Machine

{_machine(run)}

## Append cost

µs per appended message: one message per append call, each append one write
(one transaction, one invoke), measured AT the given length — the store is
prefilled to it untimed, then timed in windows of appends; the figure is the
median over the windows (`bench/run_one.py` says exactly how).

![append cost against conversation length]({PLOT})

{absolute}

Ratios, same run: each peer divided by the flowmem store it is compared
with — flowmem `sqlite://` at its default FULL for every SQLite peer (they
all run at `synchronous=FULL`), `memory://` for the in-process ones — and
each flowmem store divided by its floor at the same durability. Above 1
means slower than what it is divided by.

{ratios}

¹ not measured at this length (reason in the notes below) · ² not available
on this machine (reason below) · ³ failed (reason below).

### Interleaved ratios

On this shared machine the isolated runs above swing with the disk and CPU
weather (a FULL-durability store can be 10× slower in one minute than in the
next). The ratios the goals are about are therefore measured again, two
trials in one process with their windows alternating (A B, B A, ...: up to
25 pairs), so both sides see the same weather: flowmem's SQLite store
against the raw sqlite3 floor at the same durability, each flowmem store at
10,000 messages against itself at 100, and the SQLite peers against flowmem.
The ratio is the median of the per-pair ratios.

{_paired_table(run)}

## Reads

Full read = the whole conversation; last 50 = the newest 50 messages
through the contender's cheapest API for it (where there is none, a full read
and a slice). Medians of a few runs, taken after the timed appends.

{_reads_table(run)}

## Memory and disk

Own RSS = the peak resident memory of the contender's process, counted from
the moment the workload had been generated and converted (the kernel's peak
is reset there), minus the resident memory at that moment: what the
contender itself added — while prefilling and appending, and then including
a full read of the conversation (every message decoded into Python objects).
Process peak = the whole process, the workload included. Disk = the store's
directory after the conversation was prefilled to the length and the store
closed (one conversation).

{_memory_table(run)}

⁴ LangGraph's prefill writes the state once (one invoke with the whole
prefix); built one invoke per message, as a real conversation is, every invoke
adds checkpoints holding the whole list, so the database grows with the
square of the length. The estimate is (bytes one invoke wrote at this
length) × length ÷ 2.

## Is the stored history sendable?

At the moment a runtime sends a history — the turn in flight completed and
the next user message appended — each contender's history is read back,
converted to OpenAI Chat dicts and walked once (`bench/sendability.py`):
duplicates (a result whose call was already answered) / dangling calls (a
declared call with no result right after its turn) / orphans (a result outside
its call's block). ✅ = sendable: flowmem's own `sendability_problems` finds
nothing (content `null` on tool-calling turns is read as `""` for everyone,
as provider SDKs send it). flowmem's placeholders for interrupted calls
(MEM-3) are counted as "healed".

{_workload_line(run)}

{_sendability_table(run)}

## Goals

{_goals(run)}

## The contenders and their durability defaults

How each peer's default was found: by reading its code (installed versions
above). LangGraph's `SqliteSaver.setup` runs `PRAGMA journal_mode=WAL` and
sets no `synchronous`; the Agents SDK's `SQLiteSession._configure_connection`
sets `journal_mode=WAL` only; LangChain's `SQLChatMessageHistory` goes
through SQLAlchemy's `create_engine("sqlite:///...")`, which sets neither
(rollback journal). SQLite's own default `synchronous` is FULL (2), in WAL
mode too, for the SQLite build above. flowmem opens WAL with
`synchronous=FULL` unless the URL says `?synchronous=normal`.

{_notes(run)}

## Not measured

{_problems(run)}
"""
    (out / "benchmarks.md").write_text(text, encoding="utf-8")
