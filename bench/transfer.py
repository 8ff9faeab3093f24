"""Export/import benchmark: time and peak memory of ``flowmem export`` and ``flowmem import``.

``python bench/transfer.py [--lengths 100000,1000000]``

For each length, a SQLite conversation of that many messages is built from the
seeded agent workload (``bench/workload.py``: tool calls, re-fired and late
results, interrupted turns) in batches of 1,000; then a real ``flowmem export``
process writes it to a JSONL file and a real ``flowmem import`` process loads
that file into a fresh SQLite store (``synchronous=full``, flowmem's default).
Reports wall time and the peak resident memory of each process (its
``ru_maxrss``, read by a small wrapper process),
and checks that exporting the imported store gives the same file. Constant
memory means: the peak stays flat as the length grows ×10. Not a test.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

from flowmem import ExecutionContext, Memory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.workload import stream

ROOT = Path(__file__).resolve().parent.parent
CTX = ExecutionContext(user_id="bench")
FLOWMEM = [sys.executable, "-m", "flowmem.cli"]


def build(url: str, length: int) -> int:
    """Append ``length`` workload messages in batches; the stored count."""
    messages = stream()
    with Memory.from_url(url) as memory:
        count = 0
        while length > 0:
            batch = list(islice(messages, min(1000, length)))
            length -= len(batch)
            count = memory.append("user", "chat", batch, context=CTX).count
    return count


def _build_elsewhere(url: str, length: int) -> int:
    """:func:`build` in a child process: this one stays small, because a child's
    ``ru_maxrss`` starts from its parent's size at the fork."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bench.transfer import build; "
            f"print(build({url!r}, {length}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return int(done.stdout.strip())


_WRAPPER = ("import resource, subprocess, sys; "
            "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
            "sys.exit(code)")


def timed(command: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one process.

    Started from a small wrapper process: on Linux a child's ``ru_maxrss``
    starts from the high-water mark of the process that started it (vfork +
    exec), so measuring from this (larger) process would report our size.
    """
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _WRAPPER, *command], capture_output=True,
                          text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{command[3]} failed with exit code {done.returncode}: "
                         f"{done.stderr[-500:]}")
    return seconds, int(done.stderr.strip().splitlines()[-1]) / 1024


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as source:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()[:12]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="100000,1000000")
    args = parser.parse_args()
    print("| messages | stored | build s | export s | export peak MiB | file MiB "
          "| import s | import peak MiB | re-export identical |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for length in sorted(int(x) for x in args.lengths.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            source, target = f"sqlite:///{work / 's.db'}", f"sqlite:///{work / 't.db'}"
            started = time.perf_counter()
            stored = _build_elsewhere(source, length)
            build_s = time.perf_counter() - started
            out, again = work / "out.jsonl", work / "again.jsonl"
            export_s, export_mib = timed([*FLOWMEM, "export", "--store", source, "--scope",
                                          "user", "--user", "bench", "-o", str(out),
                                          "--no-progress"])
            import_s, import_mib = timed([*FLOWMEM, "import", "--store", target, str(out),
                                          "--no-progress"])
            subprocess.run([*FLOWMEM, "export", "--store", target, "--scope", "user",
                            "--user", "bench", "-o", str(again), "--no-progress"], check=True)
            same = filecmp.cmp(out, again, shallow=False)
            print(f"| {length:,} | {stored:,} | {build_s:.0f} | {export_s:.1f} | "
                  f"{export_mib:.0f} | {os.path.getsize(out) / 2**20:.0f} | {import_s:.1f} | "
                  f"{import_mib:.0f} | {'yes' if same else 'NO'} ({digest(out)}) |", flush=True)


if __name__ == "__main__":
    main()
