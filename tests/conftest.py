from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent / "support"))
from backends import BACKENDS, SESSION_TAG, Backend, make_backend, unavailable
from flowmem.store import Store
from profiles import PROFILE

settings.load_profile(PROFILE)  # HYPOTHESIS_PROFILE=thorough: more examples (profiles.py)
# Bytecode caches are written even where PYTHONDONTWRITEBYTECODE is set: without
# them every worker rewrites and compiles every test module again on every run.
sys.dont_write_bytecode = False

TESTS = Path(__file__).parent
# What a folder's tests need, as markers (registered in pyproject.toml), so that
# `pytest -n auto -m "not (postgres or redis or processes or server or browser)"` is
# the quick loop. A test elsewhere that needs one says so itself (``pytestmark``);
# a test run on each backend in turn is marked by its backend parameter.
FOLDER_MARKS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("stores", "postgres"): ("postgres",),
    ("stores", "redis"): ("redis",),
    ("server",): ("server",),
    ("service",): ("server",),
    ("security",): ("server",),
    ("docs",): ("docs", "processes"),
    ("erasure",): ("processes",),
}
BACKEND_MARKS: frozenset[str] = frozenset({"postgres", "redis"})


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        config.pluginmanager.register(_XdistGroups(), "flowmem_xdist_groups")
    if not hasattr(config, "workerinput"):  # once, before any worker or spawned process
        _compile_flowmem()


def _compile_flowmem() -> None:
    """Write flowmem's bytecode up front, even where ``PYTHONDONTWRITEBYTECODE`` is set:
    Python still reads it there, so each worker and each ``flowmem`` process a test
    starts need not compile the package from source again (about a minute of CPU a run).
    """
    import compileall

    import flowmem

    compileall.compile_dir(Path(flowmem.__file__).parent, quiet=1)


class _XdistGroups:
    @pytest.hookimpl(trylast=True)  # after pytest-xdist's own
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        _group(items)


@pytest.hookimpl(tryfirst=True)  # the marks must be there before -m selects by them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its folder and by the backend it runs on; leave out ``slow``.

    Long stress runs (``slow``) run only when ``-m`` names them (``pytest -m slow``).
    """
    _mark(items)
    if "slow" not in (config.option.markexpr or ""):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    items.sort(key=_runs_long, reverse=True)  # stable: otherwise the collected order


def _group(items: list[pytest.Item]) -> None:
    """Suffix a grouped test's id with ``@<xdist_group>``, as pytest-xdist does to send a
    group to one worker. Under pytest 9 the id pytest-xdist 3.8 rewrites is no longer
    the one pytest reports (pytest-xdist issue 1386), so every group was split across
    workers, each starting its own private servers; this writes the id pytest reads."""
    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if not names or item.nodeid.endswith(suffix):
            continue
        if hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(item.nodeid + suffix)
        else:
            item._nodeid = item.nodeid + suffix


def _runs_long(item: pytest.Item) -> bool:
    """Tests that start processes and the model tests: xdist hands tests out in the
    collected order, so these go first rather than leave one worker busy at the end."""
    return item.get_closest_marker("processes") is not None or "model" in item.name


def _mark(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.relative_to(TESTS).parts[:-1]
        for folder, marks in FOLDER_MARKS.items():
            if parts[:len(folder)] == folder:
                for mark in marks:
                    item.add_marker(mark)
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            for value in callspec.params.values():
                if isinstance(value, str) and value in BACKEND_MARKS:
                    item.add_marker(value)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each backend in turn; skipped with the reason when it cannot run here."""
    reason = unavailable(request.param)
    if reason:
        pytest.skip(reason)
    return make_backend(request.param, tmp_path)


@pytest.fixture
def store(backend: Backend) -> Iterator[Store]:
    opened = backend.open()
    yield opened
    opened.close()


@pytest.fixture
def reopen(backend: Backend) -> Callable[[], Store] | None:
    return backend.open if backend.persistent else None


@pytest.fixture(autouse=True)
def _close_worlds() -> Iterator[None]:
    """Close the server worlds a test opened (their loop, client and store)."""
    support = sys.modules.get("server_support")
    before = len(support.open_worlds()) if support is not None else 0
    yield
    support = sys.modules.get("server_support")
    if support is not None:
        support.close_worlds(keep=before)


@pytest.fixture(scope="session", autouse=True)
def _close_module_worlds() -> Iterator[None]:
    """Close the worlds test modules opened at import, when the run ends."""
    yield
    support = sys.modules.get("server_support")
    if support is not None:
        support.close_worlds()


@pytest.fixture(scope="session", autouse=True)
def _drop_session_data() -> Iterator[None]:
    """Remove this session's PostgreSQL schema and Redis keys when the run ends."""
    yield
    if unavailable("postgres") is None:
        from postgres_support import admin

        with admin() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SESSION_TAG}" CASCADE')
    if unavailable("redis") is None:
        from redis_support import drop_prefix

        drop_prefix(SESSION_TAG)


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a figure a test measured; the run lists them at its end (never printed by tests).

    Figures travel as the report's ``user_properties``, so they survive xdist workers.
    """
    def record(text: str) -> None:
        request.node.user_properties.append(("figure", text.strip()))
    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures the tests recorded, and the attack suite's totals, after the run."""
    figures: list[str] = []
    attack: Counter[str] = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            when = getattr(report, "when", None)
            for name, value in getattr(report, "user_properties", ()):
                if name == "figure" and when == "call":
                    figures.append(f"{report.nodeid.split('::')[-1]}: {value}")
                elif name == "attack" and when == "teardown":
                    attack.update(value)
    if figures:
        terminalreporter.section("figures")
        for line in sorted(figures):
            terminalreporter.line(line)
    if attack:
        terminalreporter.line(
            f"attack suite: {attack['requests']} requests, {attack['cases']} cases, "
            f"{attack['deviations']} deviations, {attack['5xx']} 5xx")
