"""The ``flowmem`` command: ``flowmem serve``, ``flowmem token create|list|revoke``,
``flowmem sessions`` (:mod:`flowmem.cli._sessions`), and the memory commands of
:mod:`flowmem.cli._memory` (read, write, delete,
append, history, normalize).

``flowmem serve`` runs the storage API (:func:`flowmem.server.create_app`)
under uvicorn, closed by default; ``flowmem token create`` stores a new
bearer token HASHED and prints it once. All open the store a URL names
(``--store``; default ``$FLOWMEM_STORE`` or ``sqlite:///flowmem.db`` in the
working directory).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click

from ..async_memory import AsyncMemory
from ..errors import FlowmemError, MissingDependency
from ..metrics import Metrics
from ..render import printable
from ..stores import DEFAULT_URL
from . import _erase as cli_erase
from . import _retention as cli_retention
from . import _sessions as cli_sessions
from . import _transcript as cli_transcript
from . import _transfer as cli_transfer
from ._exit import CliError, FlowmemGroup, cli_error
from ._formats import register as register_formats
from ._memory import register
from ._retention import retention_option

if TYPE_CHECKING:
    from ..service._tokens import TokenBackend

__all__ = ["main"]

logger = logging.getLogger("flowmem")

_STORE_HELP = "Store URL (default: $FLOWMEM_STORE or sqlite:///flowmem.db)."


T = TypeVar("T")


def _memory(store: str | None, metrics: Metrics | None = None,
            retention: str | None = None) -> AsyncMemory:
    try:
        return AsyncMemory.from_url(store, metrics=metrics, retention=retention)
    except FlowmemError as exc:
        raise cli_error(exc) from None


@click.group(cls=FlowmemGroup)
@click.version_option(package_name="flowmem")
def main() -> None:
    """flowmem: conversation memory for LLM agent workflows (GR-MEM)."""


def _duration(text: str | None) -> float | None:
    """``30d``, ``12h``, ``45m``, ``90s`` (or plain seconds) as seconds."""
    if text is None:
        return None
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise click.BadParameter(f"expected a duration like 30d, 12h, 45m, got {text!r}") \
            from None
    if not seconds > 0:
        raise click.BadParameter(f"a duration must be positive, got {text!r}")
    return seconds


@main.command()
@click.option("--store", default=None, help=_STORE_HELP)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to bind.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              help="How much uvicorn logs.")
@click.option("--anonymous", type=click.Choice(["read", "write"]), default=None,
              help="Let callers WITHOUT a token read (or read and write) the shared scopes. "
                   "Off by default: every /v1 route needs a token.")
@click.option("--allowed-host", "hosts", multiple=True,
              help="A Host name to answer besides localhost, 127.0.0.1, [::1] (repeatable).")
@click.option("--rate-limit", default=50.0, show_default=True, type=click.FloatRange(0),
              help="Requests a second per token on average (0: no limit).")
@click.option("--burst", default=100, show_default=True, type=click.IntRange(1),
              help="Requests a token may send at once.")
@click.option("--max-read-bytes", default=1_048_576, show_default=True,
              type=click.IntRange(1), help="Largest value /v1/memory/read answers whole.")
@click.option("--metrics-public", is_flag=True,
              help="Answer GET /metrics without a token (default: an admin token).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes sharing the port (one per core; a store processes "
                   "share: not memory://). Rate limits and /metrics are per process.")
@click.option("--retention", default=None, metavar="SCOPE=DURATION,...",
              callback=lambda _ctx, _param, text: retention_option(text),
              help="Expire data per scope, e.g. 'session=30d,user=max_age:365d' (idle by "
                   "default; max_age: since created). See docs/operations.md.")
@click.option("--sweep-interval", default="15m", show_default=True, metavar="DURATION",
              help="How often expired data is deleted, with --retention (0: never here; "
                   "run `flowmem sweep`).")
def serve(store: str | None, host: str, port: int, log_level: str, anonymous: str | None,
          hosts: tuple[str, ...], rate_limit: float, burst: int, max_read_bytes: int,
          metrics_public: bool, workers: int, retention: str | None,
          sweep_interval: str) -> None:
    """Serve the storage API over HTTP (see docs/http.md and docs/security.md)."""
    try:
        from ..access import Level
        from ..server import Limits, Settings
        from ..server._serving import allowed_hosts
        from ..server._serving import serve as run
        from ..server._workers import serve_workers, worker_spec
    except ImportError as exc:
        missing = MissingDependency(getattr(exc, "name", None) or "fastapi", "server")
        raise click.ClickException(str(missing)) from None
    interval = None if sweep_interval.strip() in ("0", "0s") else _duration(sweep_interval)
    settings = Settings(limits=Limits(max_read_bytes=max_read_bytes),
                        metrics_public=metrics_public,
                        allowed_hosts=allowed_hosts(host, hosts),
                        anonymous=Level(anonymous) if anonymous else None,
                        rate_limit=rate_limit, burst=burst,
                        sweep_interval=interval if retention else None)
    try:  # refused before anything is opened or printed
        spec = worker_spec(store or os.environ.get("FLOWMEM_STORE") or DEFAULT_URL,
                           settings, retention) if workers > 1 else None
    except FlowmemError as exc:
        raise cli_error(exc) from None
    _check_port(host, port)
    url = store or os.environ.get("FLOWMEM_STORE") or DEFAULT_URL
    new_file = _missing_sqlite_file(url)
    if url.startswith("sqlite:"):  # opened (and its schema checked) now: a file that is not
        _probe(url)                # flowmem's refuses the start, not every request
    # a bad URL, or retention over a store that keeps no expiry, stops here
    memory = _memory(store, metrics=Metrics(), retention=retention)
    if new_file is not None:
        click.echo(f"flowmem: warning: {new_file} did not exist: serving a NEW, EMPTY store "
                   f"(no sessions, no tokens); if a store was expected there, stop and restore "
                   f"it", err=True)
    if anonymous:
        logger.warning("flowmem: --anonymous %s: callers without a token may %s the shared "
                       "scopes (global, workflow, pipeline, execution) — anyone who reaches "
                       "%s:%d can %s", anonymous, "read" if anonymous == "read" else
                       "read, overwrite and delete", host, port,
                       "read them" if anonymous == "read" else "plant or erase memory")
    processes = f" with {workers} worker processes" if spec else ""
    click.echo(f"flowmem: serving {shown_store(store)} on http://{host}:{port}{processes} "
               f"(tokens must come from `flowmem token create` on this same store)", err=True)
    if spec is None:
        try:
            run(memory, settings, host=host, port=port, log_level=log_level)
        except SystemExit as exc:  # uvicorn's startup failure is 3: not a refused scope
            if exc.code not in (None, 0):
                raise CliError(f"the server could not start on {host}:{port}") from None
        return
    asyncio.run(memory.aclose())  # each worker opens its own (the schema is in place now)
    serve_workers(spec, host=host, port=port, log_level=log_level, workers=workers)


def _probe(url: str) -> None:
    """Open the store ``url`` names once and close it; its refusal as a one-line error."""
    from ..stores import open_store

    try:
        open_store(url).close()
    except FlowmemError as exc:
        raise cli_error(exc) from None


def _missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite store URL whose database file does not exist yet, else ``None``
    (another backend, ``:memory:``, or a file that exists)."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        return None
    path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if not path or path == ":memory:" or os.path.exists(path):
        return None
    return path


def _check_port(host: str, port: int) -> None:
    """Refuse (exit 1, one line) a HOST:PORT this process cannot listen on, before the
    store is opened or uvicorn starts (uvicorn would exit 3, the refused-scope code)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def shown_store(store: str | None) -> str:
    """The store URL a command opens, as safe to print (no password; a relative SQLite
    path made absolute, so two commands in two directories visibly differ)."""
    url = store or os.environ.get("FLOWMEM_STORE") or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme == "sqlite" and not parts.path.startswith("//"):
        return f"sqlite:///{os.path.abspath(parts.path.lstrip('/'))}"
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    return url


@main.group()
def token() -> None:
    """Manage bearer tokens (stored hashed; a token is shown once)."""


def _tokens(store: str | None, work: Callable[[TokenBackend], Awaitable[T]]) -> T:
    """Run ``work`` on the store's tokens in one event loop that opens and closes the store."""
    from ..service._tokens import TokenBackend

    async def run() -> T:
        async with _memory(store) as memory:
            return await work(TokenBackend(memory.store))

    try:
        return asyncio.run(run())
    except FlowmemError as exc:
        raise cli_error(exc) from None


@token.command("create")
@click.option("--user", "user_id", required=True, help="The user id the token stands for.")
@click.option("--admin", is_flag=True, help="Grant the administrative tier (MEM-15).")
@click.option("--grant", "grants", multiple=True, metavar="SCOPE:GLOB:read|write",
              help="Reach a shared scope, e.g. 'workflow:support-*:write' (repeatable; "
                   "write implies read).")
@click.option("--expires", default=None, metavar="DURATION",
              help="Expire after 30d, 12h, 45m, 90s (default: never).")
@click.option("--store", default=None, help=_STORE_HELP)
def token_create(user_id: str, admin: bool, grants: tuple[str, ...], expires: str | None,
                 store: str | None) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from ..ids import usable_id

    if usable_id(user_id) is None or len(user_id) > 256:
        raise click.BadParameter(f"{user_id!r} is not a usable user id (blank, or \"0\", "
                                 "the anonymous user; at most 256 characters)",
                                 param_hint="--user")
    seconds = _duration(expires)
    if shown_store(store).startswith("memory://"):
        raise click.ClickException("a memory:// store lives in one process: a token created "
                                   "here is gone when this command ends; give the --store "
                                   "that `flowmem serve` uses")
    value = _tokens(store, lambda backend: backend.create(user_id, admin=admin, grants=grants,
                                                          expires_in=seconds))
    click.echo(value)
    click.echo(f"flowmem: token stored in {shown_store(store)}; the server must use this "
               f"store", err=True)


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per token.")
@click.option("--store", default=None, help=_STORE_HELP)
def token_list(as_json: bool, store: str | None) -> None:
    """List tokens: id, user, admin, grants, created, expires, last used (never the secret)."""
    tokens = _tokens(store, lambda backend: backend.tokens())
    if as_json:
        for info in tokens:
            click.echo(json.dumps(info.to_json(), ensure_ascii=True))
        return
    rows: list[tuple[str, ...]] = [("ID", "USER", "ADMIN", "GRANTS", "CREATED", "EXPIRES",
                                    "LAST USED")]
    rows += [tuple(printable(cell) for cell in (
        t.id, t.user_id, "yes" if t.admin else "no", ",".join(t.grants) or "-",
        _when(t.created_at), _when(t.expires_at), _when(t.last_used_at))) for t in tokens]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                       strict=True)).rstrip())


@token.command("revoke")
@click.argument("token_id")
@click.option("--store", default=None, help=_STORE_HELP)
def token_revoke(token_id: str, store: str | None) -> None:
    """Revoke the token with this id (from ``flowmem token list``): it answers 401 at once."""
    revoked = _tokens(store, lambda backend: backend.revoke(token_id))
    if not revoked:
        raise click.ClickException(f"no token with id {token_id!r}")
    click.echo(f"revoked {token_id}")


register(main)
register_formats(main)
cli_transfer.register(main)
cli_transcript.register(main)
cli_sessions.register(main)
cli_retention.register(main)
cli_erase.register(main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
