"""``flowmem sessions``: the service's sessions, from the shell.

``list``, ``show``, ``create``, ``stop``, ``reset`` and ``viewers add|remove`` work on the
session registry of ``flowmem serve`` (:class:`flowmem.server.SessionRegistry`)
in the store a URL names, the same records the HTTP routes serve. Like
``flowmem token``, this is an operator's tool with direct access to the store:
no token is asked for, and the access rules of the HTTP service (MEM-8,
MEM-9, MEM-15) are the service's, not this command's. Each command runs one
event loop that opens the store (:class:`flowmem.AsyncMemory`), does its
work and closes it.

``flowmem transcript SESSION`` (:mod:`flowmem.cli._transcript`) prints a
session's conversation; :func:`load_session` is shared with it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

from ..async_memory import AsyncMemory
from ..errors import FlowmemError, MissingDependency
from ..ids import usable_id
from ..render import printable
from ._common import store_option
from ._exit import cli_error

if TYPE_CHECKING:
    from ..access import SessionRecord
    from ..service._sessions import SessionRegistry

__all__ = ["load_session", "register", "sessions", "with_registry"]

T = TypeVar("T")
MAX_TITLE: Final = 200
"""The longest title, as the HTTP service takes it (POST /v1/sessions)."""
_PAGE: Final = 500

session_argument = click.argument("session_id", metavar="SESSION")


def with_registry(store: str | None,
                  work: Callable[[SessionRegistry, AsyncMemory], Awaitable[T]]) -> T:
    """Run ``work`` in one event loop that opens the store and closes it; a
    :class:`FlowmemError` becomes a clean ``Error:`` line (exit 1)."""
    try:
        from ..service._sessions import SessionRegistry
    except ImportError as exc:
        missing = MissingDependency(getattr(exc, "name", None) or "fastapi", "server")
        raise click.ClickException(str(missing)) from None

    async def run() -> T:
        async with AsyncMemory.from_url(store) as memory:
            return await work(SessionRegistry(memory.store, retention=memory.retention,
                                              clock=memory.clock), memory)

    try:
        return asyncio.run(run())
    except FlowmemError as exc:
        raise cli_error(exc) from None


async def load_session(registry: SessionRegistry, session_id: str) -> SessionRecord:
    """The session, or a clean ``Error: no session …`` (exit 1)."""
    record = await registry.load(session_id)
    if record is None:
        raise click.ClickException(f"no session {session_id!r} in this store "
                                   "(ids come from `flowmem sessions list`)")
    return record


def _user(value: str, option: str) -> str:
    user = usable_id(value)
    if user is None:
        raise click.BadParameter(f"{value!r} is not a usable user id (blank, or \"0\", "
                                 "the anonymous user)", param_hint=option)
    return user


def _echo_record(record: SessionRecord, extra: dict[str, Any] | None = None) -> None:
    click.echo(json.dumps(record.to_json() | (extra or {}), ensure_ascii=True, indent=2))


def _when(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if stamp else "-"


@click.group("sessions")
def sessions() -> None:
    """The service's sessions: list, show, create, stop, reset, viewers (no token
    needed: direct access to the store)."""


@sessions.command("create")
@click.option("--owner", default=None, metavar="USER",
              help="The user who owns the session; their user memory is its memory (MEM-8).")
@click.option("--owner-less", is_flag=True,
              help="Create a session without an owner (its user scope is refused, MEM-6).")
@click.option("--title", default="", help=f"A title (at most {MAX_TITLE} characters).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole record, not the id.")
@store_option
def create(owner: str | None, owner_less: bool, title: str, as_json: bool,
           store: str | None) -> None:
    """Create a session and print its id."""
    if owner_less == (owner is not None):
        raise click.UsageError("give exactly one of --owner USER and --owner-less")
    if len(title) > MAX_TITLE:
        raise click.BadParameter(f"at most {MAX_TITLE} characters, got {len(title)}",
                                 param_hint="--title")
    user = None if owner is None else _user(owner, "--owner")
    record = with_registry(store, lambda registry, _: registry.create(user, title))
    if as_json:
        _echo_record(record)
    else:
        click.echo(record.id)


def _oldest_first(found: list[SessionRecord], offset: int,
                  limit: int | None) -> list[SessionRecord]:
    """By creation time, oldest first (ties by id), then ``offset`` and ``limit``."""
    ordered = sorted(found, key=lambda r: (r.created_at, r.id))
    return ordered[offset:] if limit is None else ordered[offset:offset + limit]


@sessions.command("list")
@click.option("--user", default=None, metavar="USER",
              help="Only the sessions this user owns (default: every session).")
@click.option("--shared", is_flag=True,
              help="With --user: the sessions shared with the user (viewer), not owned.")
@click.option("--limit", type=click.IntRange(1), default=None, help="At most this many.")
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True,
              help="Skip this many first.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per session.")
@store_option
def listing(user: str | None, shared: bool, limit: int | None, offset: int, as_json: bool,
            store: str | None) -> None:
    """List sessions, oldest first (by creation time): id, owner, status, viewers,
    updated, title."""
    if shared and user is None:
        raise click.UsageError("--shared needs --user")
    if user is not None:
        who, relation = _user(user, "--user"), "viewer" if shared else "owner"
        everyone, _ = with_registry(store, lambda registry, _: registry.listing(
            who, relation, offset=0, limit=2**31))
    else:
        everyone = with_registry(store, lambda registry, _: registry.every())
    found = _oldest_first(everyone, offset, limit)
    if as_json:
        for record in found:
            click.echo(json.dumps(record.to_json(), ensure_ascii=True))
        return
    rows: list[tuple[str, ...]] = [("ID", "OWNER", "STATUS", "VIEWERS", "UPDATED", "TITLE")]
    rows += [tuple(printable(cell) for cell in (  # stored text: escapes shown, not obeyed
        r.id, r.owner or "-", r.status, ",".join(sorted(r.viewers)) or "-",
        _when(r.updated_at), r.title)) for r in found]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in
                             zip(row, widths, strict=True)).rstrip())


@sessions.command("show")
@session_argument
@store_option
def show(session_id: str, store: str | None) -> None:
    """Print one session's record as JSON, with how many messages it holds."""
    from ..service._sessions import TRANSCRIPT_KEY, session_context

    async def work(registry: SessionRegistry, memory: AsyncMemory) -> tuple[Any, int | None]:
        record = await load_session(registry, session_id)
        page = await memory.history("session", TRANSCRIPT_KEY, context=session_context(record),
                                    last=1)
        return record, page.total

    record, total = with_registry(store, work)
    _echo_record(record, {"messages": total})


@sessions.command("stop")
@session_argument
@store_option
def stop(session_id: str, store: str | None) -> None:
    """Stop a session: it takes no turn until reset (`flowmem sessions reset SESSION`,
    or POST /v1/sessions/ID/reset)."""
    async def work(registry: SessionRegistry, _: AsyncMemory) -> SessionRecord:
        await load_session(registry, session_id)
        record = await registry.set_status(session_id, "stopped")
        return record if record is not None else await load_session(registry, session_id)

    _echo_record(with_registry(store, work))


@sessions.command("reset")
@session_argument
@store_option
def reset(session_id: str, store: str | None) -> None:
    """Reset a session: delete its conversation and every session-scope key; status
    idle, so it takes turns again (as POST /v1/sessions/ID/reset)."""
    from ..service._sessions import clear_memory

    async def work(registry: SessionRegistry, memory: AsyncMemory) -> SessionRecord:
        record = await load_session(registry, session_id)
        await clear_memory(memory, record)
        changed = await registry.set_status(session_id, "idle")
        return changed if changed is not None else await load_session(registry, session_id)

    _echo_record(with_registry(store, work))


@sessions.group("viewers")
def viewers() -> None:
    """Who may view a session (view only: driving is the owner's, MEM-9)."""


def _change_viewer(session_id: str, user: str, store: str | None, grant: bool) -> None:
    viewer = _user(user, "USER")

    async def work(registry: SessionRegistry, _: AsyncMemory) -> SessionRecord:
        await load_session(registry, session_id)
        change = registry.grant if grant else registry.revoke
        record = await change(session_id, viewer)
        return record if record is not None else await load_session(registry, session_id)

    _echo_record(with_registry(store, work))


@viewers.command("add")
@session_argument
@click.argument("user", metavar="USER")
@store_option
def viewers_add(session_id: str, user: str, store: str | None) -> None:
    """Let USER view SESSION (read its transcript, never drive it)."""
    _change_viewer(session_id, user, store, grant=True)


@viewers.command("remove")
@session_argument
@click.argument("user", metavar="USER")
@store_option
def viewers_remove(session_id: str, user: str, store: str | None) -> None:
    """Take view of SESSION back from USER."""
    _change_viewer(session_id, user, store, grant=False)


def register(group: click.Group) -> None:
    """Add ``sessions`` to the ``flowmem`` group."""
    group.add_command(sessions)
