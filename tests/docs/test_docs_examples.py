"""Every shell and Python example of README.md and docs/*.md runs as written (issue #16).

An example is a fenced block in ``sh``, ``bash``, ``console`` (its ``$ `` lines)
or ``python``. Each runs as a user would run it: in a fresh empty directory,
with a PATH holding this repository's ``flowmem`` and ``python`` (the test's
own interpreter) and the system's tools, no virtual environment and no
``FLOWMEM_*`` variable. Shell examples run under ``bash -e -o pipefail``; a
shown answer that names an ``"error_code":"…"`` in a ``#`` comment must be
in the output. What the test provides:

- **A service.** The docs' port 8080 is replaced by a free port. An example
  that talks to localhost:8080 without starting ``flowmem serve`` itself gets
  one, started by the test over the example directory's ./flowmem.db (so a
  ``flowmem token create`` in the example reaches the same store).
- **PostgreSQL and Redis.** A URL on 127.0.0.1/localhost is moved to the test
  servers of tests/backends.py (``FLOWMEM_TEST_POSTGRES`` db ``test``,
  ``FLOWMEM_TEST_REDIS`` db 15) under a schema / key prefix of this run,
  removed at the end; never a flush. Unreachable: those examples skip.

Two markers, an HTML comment on the line right before the fence:

- ``<!-- not run: REASON -->``: not run, for the reason given (installs into
  the environment, serves until stopped, takes many minutes). Few, each with
  its reason; :func:`test_figures` lists them.
- ``<!-- continues the previous example -->``: runs after the previous
  example, in its directory, against its service (a walk-through in steps).

This is the one runner of the docs' examples: it replaced test_readme.py,
test_server_docs.py and the example runners of test_formats_docs.py and
test_integrations_docs.py (which keep their other checks).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends import SESSION_TAG, unavailable
from docs_support import (
    ROOT,
    Example,
    adapt,
    chains,
    console_commands,
    doc_paths,
    examples,
    run_chain,
)
from figures import Figure

ALL: list[Example] = [example for path in doc_paths() for example in examples(path)]
CHAINS = chains(ALL)
_TAGS: set[str] = set()


@pytest.fixture(scope="module", autouse=True)
def _drop_docs_data() -> Iterator[None]:
    """Remove every PostgreSQL schema and Redis prefix the examples wrote under."""
    yield
    if not _TAGS:
        return
    if unavailable("postgres") is None:
        from postgres_support import admin

        with admin() as conn:
            for tag in _TAGS:
                conn.execute(f'DROP SCHEMA IF EXISTS "{tag}" CASCADE')
    if unavailable("redis") is None:
        from redis_support import drop_prefix

        for tag in _TAGS:
            drop_prefix(tag)


def _shown_codes(example: Example) -> list[str]:
    if example.lang == "python":
        return []
    return re.findall(r'^\s*#.*"error_code":\s*"([a-z_]+)"', example.code, re.M)


@pytest.mark.parametrize("chain", CHAINS, ids=[chain[0].name for chain in CHAINS])
def test_example_runs_as_written(chain: list[Example], tmp_path: Path) -> None:
    tag = f"{SESSION_TAG}_docs{CHAINS.index(chain)}"
    outcomes, tags = run_chain(chain, tmp_path, tag)
    _TAGS.update(tags)
    for outcome in outcomes:
        name, output = outcome.example.name, outcome.output
        assert outcome.returncode == 0, f"{name} exited {outcome.returncode}:\n{output}"
        assert "Traceback (most recent call last)" not in output, f"{name}:\n{output}"
        for code in _shown_codes(outcome.example):
            assert f'"error_code":"{code}"' in output, f"{name}: {code} not answered:\n{output}"


def test_markers_stand_before_examples() -> None:
    """A marker on anything but an example's fence would be ignored silently."""
    for path in doc_paths():
        lines = path.read_text(encoding="utf-8").splitlines()
        marked = {example.line - 1 for example in examples(path)}
        for number, line in enumerate(lines, start=1):
            if re.match(r"\s*<!--\s*(not run|continues)", line):
                assert number in marked, f"{path.name}:{number}: a marker before no example"


def test_figures(figure: Figure) -> None:
    """The census (shown with ``-s``): examples found, run, and not run with why."""
    not_run = [example for example in ALL if example.not_run is not None]
    run = sum(len(chain) for chain in CHAINS)
    assert run + len(not_run) == len(ALL)
    assert all(example.not_run for example in not_run)  # a reason, never empty
    figure(f"\ndocs examples: {len(ALL)} found in {len(doc_paths())} documents, {run} run "
          f"in {len(CHAINS)} chains, {len(not_run)} not run:")
    for example in not_run:
        figure(f"  {example.name}: {example.not_run}")
    assert len(not_run) <= len(ALL) // 2, "not run should stay the exception"


def test_docs_never_point_outside_the_repository() -> None:
    """Users do not have the shared spec directory: links stay inside the clone."""
    for path in doc_paths():
        for target in re.findall(r"\]\(([^)#\s]+)", path.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            assert (path.parent / target).resolve().is_relative_to(ROOT), (path.name, target)
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


SAMPLE = """# t

```sh
echo one
```

<!-- continues the previous example -->
```bash
echo two
```

<!-- not run: serves until stopped -->
```python
print("never")
```

```json
{"not": "an example"}
```

```console
$ echo three \\
  four
three four
```
"""


def test_the_extractor_reads_fences_and_markers(tmp_path: Path) -> None:
    doc = tmp_path / "sample.md"
    doc.write_text(SAMPLE, encoding="utf-8")
    found = examples(doc)
    assert [(e.lang, e.not_run, e.continues) for e in found] == [
        ("sh", None, False), ("bash", None, True),
        ("python", "serves until stopped", False), ("console", None, False)]
    assert [[e.lang for e in chain] for chain in chains(found)] == [["sh", "bash"], ["console"]]
    assert console_commands(found[-1].code) == "echo three \\\n  four\n"


def test_services_are_moved_to_this_run() -> None:
    code = ("flowmem serve --port 8080 --store 'redis://localhost:6379/0?prefix=app'\n"
            "psql postgresql://127.0.0.1/test?schema=s; curl db.internal:8080 redis://h.example/0")
    adapted, needs = adapt(code, port=5555, tag="T")
    assert needs == {"redis", "postgres"}
    assert "8080" not in adapted and adapted.count("5555") == 2
    assert "prefix=T_app" in adapted and "schema=T_s" in adapted
    assert "redis://h.example/0" in adapted  # not local: left for the example to fail on
