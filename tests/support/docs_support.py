"""The examples of README.md and docs/*.md: found, chained, and run (tests/test_docs_examples.py).

An *example* is a fenced block whose language is ``sh``, ``bash``, ``console``
or ``python``. Two HTML comments, on the line right before a fence, change how
it runs (they show in the Markdown source, not on the rendered page):

- ``<!-- not run: REASON -->`` — the block is not run (it installs into the
  environment, serves until stopped, takes many minutes, …); REASON is said.
- ``<!-- continues the previous example -->`` — the block runs after the one
  before it, in the same directory and against the same service.

Everything else about running an example is in :func:`run_chain`.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from backends import POSTGRES_URL, REDIS_URL, unavailable
from server_support import free_port

__all__ = ["ROOT", "Example", "Outcome", "adapt", "chains", "console_commands", "doc_paths",
           "examples", "run_chain"]

ROOT = Path(__file__).resolve().parents[2]
LANGUAGES = frozenset({"sh", "bash", "console", "python"})
FENCE = re.compile(r"^(?P<fence>```+)(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^(?P=fence)[ \t]*$",
                   re.S | re.M)
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->$")
CONTINUES = "<!-- continues the previous example -->"
DOC_PORT = "8080"
"""The port the docs' service examples use; each run gets a free one instead."""
TIMEOUT = 180.0


@dataclass(frozen=True)
class Example:
    """One fenced example of one document."""

    doc: str
    line: int
    lang: str
    code: str
    not_run: str | None
    continues: bool

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class Outcome:
    """What one example did when run."""

    example: Example
    returncode: int
    output: str


def doc_paths() -> list[Path]:
    """README.md and every docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def examples(path: Path) -> list[Example]:
    """The examples of one document, in order."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        if match["lang"] not in LANGUAGES:
            continue
        before = text[:match.start()].rstrip("\n").rpartition("\n")[2].strip()
        marker = NOT_RUN.match(before)
        doc = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        found.append(Example(doc, text.count("\n", 0, match.start()) + 1,
                             match["lang"], match["code"],
                             marker["reason"] if marker else None, before == CONTINUES))
    return found


def chains(found: list[Example]) -> list[list[Example]]:
    """Runnable examples grouped: each chain runs in one directory, in order."""
    grouped: list[list[Example]] = []
    for example in found:
        if example.not_run is not None:
            assert not example.continues, f"{example.name}: both markers"
            continue
        if example.continues:
            assert grouped and grouped[-1][-1].doc == example.doc, (
                f"{example.name} continues an example that is not run")
            grouped[-1].append(example)
        else:
            grouped.append([example])
    return grouped


# --- the services an example may use -------------------------------------------------


def _local(url: str) -> bool:
    try:
        return urlsplit(url).hostname in ("127.0.0.1", "localhost")
    except ValueError:  # a pattern such as redis://[user:password@]host, not a URL
        return False


def _retarget(url: str, base: str, option: str, tag: str) -> str:
    """``url`` moved onto ``base`` with its own ``option`` (schema/prefix) under ``tag``."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    own = query.pop(option, "")
    query[option] = f"{tag}_{own}" if own else tag
    target = urlsplit(base)
    merged = dict(parse_qsl(target.query)) | query
    return urlunsplit((target.scheme, target.netloc, target.path, urlencode(merged), ""))


URL = re.compile(r"(?P<url>(?P<scheme>redis|rediss|postgresql|postgres)://[^\s'\"`)\]]*)")


def adapt(code: str, *, port: int, tag: str) -> tuple[str, set[str]]:
    """The example as it runs here, and the backends it needs.

    The documented port 8080 becomes a free one; a local Redis URL moves to the
    test Redis (``FLOWMEM_TEST_REDIS``, db 15) under a key prefix of this run, a
    local PostgreSQL URL to the test database under a schema of this run.
    """
    needs: set[str] = set()

    def swap(match: re.Match[str]) -> str:
        url = match["url"]
        if not _local(url):
            return url
        if match["scheme"].startswith("redis"):
            needs.add("redis")
            return _retarget(url, REDIS_URL, "prefix", tag)
        needs.add("postgres")
        return _retarget(url, POSTGRES_URL, "schema", tag)

    code = URL.sub(swap, code)
    return re.sub(rf"\b{DOC_PORT}\b", str(port), code), needs


def used_tags(code: str, tag: str) -> set[str]:
    """Every schema or prefix an adapted example may write under."""
    return set(re.findall(rf"{re.escape(tag)}\w*", code))


# --- running ---------------------------------------------------------------------------


def _wrapper(path: Path, target: Path) -> None:
    path.write_text(f"#!/bin/sh\nexec {shlex.quote(str(target))} \"$@\"\n", encoding="utf-8")
    path.chmod(0o755)


def environment(home: Path) -> dict[str, str]:
    """A PATH with this repository's ``flowmem`` and ``python`` (the test's own
    interpreter, as ``python`` and ``python3``) before the system's, and no
    virtual environment on it; no ``FLOWMEM_*`` variable; ``TMPDIR`` private."""
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    interpreter = Path(sys.executable)
    for name in ("python", "python3"):
        _wrapper(bin_dir / name, interpreter)
    _wrapper(bin_dir / "flowmem", interpreter.parent / "flowmem")
    (home / "tmp").mkdir(exist_ok=True)
    system = [d for d in ("/usr/local/bin", "/usr/bin", "/bin") if Path(d).is_dir()]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLOWMEM_", "PYTHON", "VIRTUAL_ENV", "PYTEST", "COV_"))}
    env.update(PATH=os.pathsep.join([str(bin_dir), *system]), TMPDIR=str(home / "tmp"),
               HOME=str(home), LC_ALL="C.UTF-8", COLUMNS="100", NO_COLOR="1")
    return env


def console_commands(code: str) -> str:
    """A ``console`` block's commands (the ``$ `` lines and their continuations)."""
    commands, going = [], False
    for line in code.splitlines():
        if line.startswith("$ ") or going:
            commands.append(line[2:] if line.startswith("$ ") else line)
            going = line.endswith("\\")
    return "\n".join(commands) + "\n"


def _command(example: Example, code: str, scratch: Path) -> list[str]:
    script = scratch / f"{example.doc.replace('/', '_')}_{example.line}"
    if example.lang == "python":
        script = script.with_suffix(".py")
        script.write_text(code, encoding="utf-8")
        return ["python", str(script)]
    if example.lang == "console":
        code = console_commands(code)
    # Background jobs (a `flowmem serve &`) are stopped however the script ends.
    script.with_suffix(".sh").write_text(
        "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + code, encoding="utf-8")
    return ["bash", "-e", "-o", "pipefail", str(script.with_suffix(".sh"))]


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        output += f"\n[timed out after {TIMEOUT:.0f} s]".encode()
    finally:
        with suppress(ProcessLookupError):  # anything the example left behind
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, output.decode("utf-8", "replace")


@contextmanager
def serving(cwd: Path, env: dict[str, str], port: int) -> Iterator[None]:
    """``flowmem serve`` on ``port`` over ``cwd``'s ./flowmem.db, until the block ends."""
    log = (cwd.parent / "serve.log").open("wb")
    process = subprocess.Popen(["flowmem", "serve", "--port", str(port), "--log-level",
                                "warning"], cwd=cwd, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("flowmem serve did not start: "
                                         + (cwd.parent / "serve.log").read_text()) from None
                time.sleep(0.1)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _needs_service(codes: list[str]) -> bool:
    """A chain that talks to localhost:8080 but starts no ``flowmem serve`` itself."""
    talks = any(re.search(rf"(localhost|127\.0\.0\.1):{DOC_PORT}\b", c) for c in codes)
    return talks and not any(re.search(r"^\s*flowmem serve\b", c, re.M) for c in codes)


def run_chain(chain: list[Example], home: Path, tag: str) -> tuple[list[Outcome], set[str]]:
    """Run a chain of examples; their outcomes and the schemas/prefixes they used.

    Each chain gets a fresh empty working directory (so ``./flowmem.db`` is its
    own), the :func:`environment`, and a free port in place of 8080. When it
    talks to localhost:8080 without starting ``flowmem serve`` itself, the test
    serves one there over that directory's ./flowmem.db. Shell examples run
    under ``bash -e -o pipefail`` (a failing command fails the example);
    Python examples with the ``python`` on that PATH. Runs stop at the first
    failure. Examples whose PostgreSQL or Redis is not reachable skip.
    """
    import pytest

    env = environment(home)
    work, scratch = home / "work", home / "scripts"
    work.mkdir()
    scratch.mkdir()
    port = free_port()  # below the ephemeral range (server_support)
    adapted = [adapt(example.code, port=port, tag=tag) for example in chain]
    for backend in set().union(*(needs for _, needs in adapted)):
        reason = unavailable(backend)
        if reason:
            pytest.skip(reason)
    codes = [code for code, _ in adapted]
    tags = set().union(*(used_tags(code, tag) for code in codes))
    outcomes: list[Outcome] = []
    service = serving(work, env, port) if _needs_service([e.code for e in chain]) else None
    with service if service is not None else _nothing():
        for example, code in zip(chain, codes, strict=True):
            returncode, output = _run(_command(example, code, scratch), work, env)
            outcomes.append(Outcome(example, returncode, output))
            if returncode != 0:
                break
    return outcomes, tags


@contextmanager
def _nothing() -> Iterator[None]:
    yield
