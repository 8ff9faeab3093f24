"""Bearer tokens: create, list, revoke, expire, and resolve a request to a :class:`Principal`.

Authentication only: WHO calls. What the caller may do is decided by
:mod:`flowmem.access` (like starlette's ``AuthenticationBackend``, this
module never enforces). Tokens are stored HASHED (SHA-256 of a
``secrets.token_urlsafe`` secret) in the store's reserved scope; the token
itself is shown once, when it is created. A token's public id is the first
16 hex digits of its hash: enough to list and revoke it, useless to forge it.

A record holds the user id, the admin flag, the grants
(``scope:glob:read|write``), when it was created, when it expires and when
it was last used (best-effort bookkeeping: noted at most once a minute per
token and written in batches by a task of its own after the answer, never on
a read-only store, a failure logged and never the request's). An expired or
revoked token is refused at once: the service keeps a verified token in
memory (:mod:`.changes`) only until a revocation — by any process — is
announced, and checks the expiry on every use; a revocation announces itself
(:func:`~.changes.announce`). Every method is a coroutine over an
:class:`~flowmem.store.AsyncStore` (the service's loop never blocks on the
store; the CLI runs them with :func:`asyncio.run`).

A header that is present but not a valid bearer token is refused (401),
never downgraded to anonymous. Identity never comes from a request body.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from ..access import Grant, Principal
from ..errors import InvalidInput, StoreBusy, StoreReadOnly
from ..ids import usable_id
from ..store import AsyncStore
from ._changes import Changes, announce
from ._records import DELETE, KEEP, modify
from ._registry import RESERVED_SCOPE, KeyLocks, as_mapping, reserved

__all__ = ["TOKEN_PREFIX", "InvalidCredentials", "TokenBackend", "TokenInfo", "bearer_token",
           "hash_token"]

logger = logging.getLogger("flowmem")

TOKEN_PREFIX: Final = "fm_"
_TOKENS: Final = "tokens"
_MAX_TOKEN_LENGTH: Final = 256
_ID_LENGTH: Final = 16
_TOUCH_EVERY: Final = 60.0
_LOCK_TIMEOUT: Final = 2.0


class InvalidCredentials(Exception):
    """An ``Authorization`` header that is not a valid bearer token (401)."""


def hash_token(token: str) -> str:
    """The stored form of a token: SHA-256, hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def bearer_token(authorization: str) -> str | None:
    """The token of an ``Authorization`` header value (scheme ``Bearer`` in any case,
    any run of spaces), or ``None`` for another scheme."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip()


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What ``flowmem token list`` shows of a token (never the secret)."""

    id: str
    user_id: str
    admin: bool
    grants: tuple[str, ...]
    created_at: float
    expires_at: float | None
    last_used_at: float | None

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the fields."""
        return {"id": self.id, "user_id": self.user_id, "admin": self.admin,
                "grants": list(self.grants), "created_at": self.created_at,
                "expires_at": self.expires_at, "last_used_at": self.last_used_at}


def _info(digest: str, record: dict[str, Any]) -> TokenInfo | None:
    user = usable_id(record.get("user_id"))
    if user is None:
        return None
    expires, used = record.get("expires_at"), record.get("last_used_at")
    return TokenInfo(id=digest[:_ID_LENGTH], user_id=user, admin=record.get("admin") is True,
                     grants=tuple(str(g) for g in record.get("grants") or ()),
                     created_at=float(record.get("created_at") or 0.0),
                     expires_at=float(expires) if isinstance(expires, int | float) else None,
                     last_used_at=float(used) if isinstance(used, int | float) else None)


class TokenBackend:
    """Creates, lists, revokes and resolves bearer tokens kept in a store."""

    def __init__(self, store: AsyncStore, changes: Changes | None = None) -> None:
        self.store = store
        self.changes = changes
        self._locks = KeyLocks()
        self._touched: dict[str, float] = {}
        self._pending: dict[str, float] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._read_only = getattr(store, "read_only", False) is True

    async def create(self, user_id: str, *, admin: bool = False, grants: Iterable[str] = (),
               expires_in: float | None = None) -> str:
        """A new token for ``user_id``; returns the token, stored hashed.

        ``grants`` are ``scope:glob:read|write`` strings (checked here);
        ``expires_in`` is in seconds (``None``: never).
        """
        user = usable_id(user_id)
        if user is None or len(user) > 256:
            raise InvalidInput(f"user id must be a usable id of at most 256 characters, "
                               f"got {user_id!r}")
        try:
            parsed = [str(Grant.parse(g)) for g in grants]
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if expires_in is not None and not expires_in > 0:
            raise InvalidInput(f"expiry must be a positive duration, got {expires_in!r} s")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        record = {"user_id": user, "admin": bool(admin), "grants": parsed, "created_at": now,
                  "expires_at": None if expires_in is None else now + expires_in,
                  "last_used_at": None}
        await self.store.write(reserved(_TOKENS, hash_token(token)), record)
        return token

    async def tokens(self) -> list[TokenInfo]:
        """Every stored token, oldest first."""
        found: list[TokenInfo] = []
        after: str | None = None
        while digests := await self.store.keys(RESERVED_SCOPE, _TOKENS, after=after, limit=500):
            for digest in digests:
                ok, value = await self.store.read(reserved(_TOKENS, digest))
                record = as_mapping(value) if ok else None
                info = _info(digest, record) if record is not None else None
                if info is not None:
                    found.append(info)
            after = digests[-1]
        return sorted(found, key=lambda t: (t.created_at, t.id))

    async def revoke(self, token_id: str) -> bool:
        """Forget the token whose id (or whole hash) is ``token_id``; whether it existed."""
        wanted = token_id.strip().lower()
        if len(wanted) < _ID_LENGTH or any(c not in "0123456789abcdef" for c in wanted):
            return False
        digests = await self.store.keys(RESERVED_SCOPE, _TOKENS, prefix=wanted, limit=2)
        if len(digests) != 1:
            return False
        key = reserved(_TOKENS, digests[0])
        existed = [False]

        def gone(found: bool, _: Any) -> Any:
            existed[0] = found
            return DELETE if found else KEEP

        try:
            try:
                await modify(self.store, self._locks, key, gone, _LOCK_TIMEOUT)
            except StoreBusy:  # a revoke is never refused for a busy lock: delete anyway
                existed[0] = (await self.store.delete(key)).found
        finally:  # landed or not, this process reads the record again on its next use
            if self.changes is not None:
                self.changes.tokens.replace(digests[0], None)
        await announce(self.store)
        return existed[0]

    async def lookup(self, token: str) -> Principal | None:
        """The principal a live token stands for, or ``None`` (unknown, revoked, expired)."""
        if not token or len(token) > _MAX_TOKEN_LENGTH:
            return None
        digest = hash_token(token)
        verified = await self._verified(digest)
        if verified is None:
            return None
        principal, expires_at = verified
        now = time.time()
        if expires_at is not None and expires_at <= now:
            return None
        await self._touch(digest, now)
        return principal

    async def _verified(self, digest: str) -> tuple[Principal, float | None] | None:
        """The principal and expiry of a stored token: kept in memory by a serving
        process (:mod:`.changes`), else read."""
        changes = self.changes
        if changes is not None:
            await changes.settle()
            kept: tuple[Principal, float | None] | None = changes.tokens.get(digest)
            if kept is not None:
                return kept
            epoch = changes.tokens.epoch
        found, value = await self.store.read(reserved(_TOKENS, digest))
        record = as_mapping(value) if found else None
        info = _info(digest, record) if record is not None else None
        if info is None:
            return None
        try:
            grants = tuple(Grant.parse(g) for g in info.grants)
        except ValueError:
            return None  # a damaged record grants nothing: refuse the token
        verified = (Principal(info.user_id, info.admin, grants), info.expires_at)
        if changes is not None:
            changes.tokens.put(digest, verified, epoch)
        return verified

    async def _touch(self, digest: str, now: float) -> None:
        """Note ``last_used_at`` (at most once a minute per token, per process) for the
        flusher: bookkeeping never fails, blocks or delays a request. Nothing is noted
        on a read-only store."""
        if self._read_only or now - self._touched.get(digest, 0.0) < _TOUCH_EVERY:
            return
        self._touched[digest] = now
        self._pending[digest] = now
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self.flush())

    async def flush(self) -> None:
        """Write the noted ``last_used_at`` stamps, in a batch, after the requests that
        noted them were answered (a task of its own; :meth:`_touch` never awaits it).
        A failure is logged, never raised; a read-only store stops the bookkeeping."""
        while self._pending and not self._read_only:
            batch, self._pending = self._pending, {}
            for digest, used in batch.items():
                try:
                    await self._stamp(digest, used)
                except StoreReadOnly:
                    self._read_only = True
                    logger.info("flowmem: the store is read-only; tokens' last use is not "
                                "recorded")
                except Exception as exc:  # bookkeeping: logged, never the caller's failure
                    logger.warning("flowmem: could not record a token's last use: %s", exc)

    async def _stamp(self, digest: str, used: float) -> None:
        def stamped(found: bool, current: Any) -> Any:  # never resurrect a revoked token
            if found and isinstance(current, dict):
                return {**current, "last_used_at": used}
            return KEEP

        await modify(self.store, self._locks, reserved(_TOKENS, digest), stamped,
                     _LOCK_TIMEOUT)

    @staticmethod
    def token_id(token: str) -> str:
        """The public id of a token (what ``token list`` shows)."""
        return hash_token(token)[:_ID_LENGTH]

    async def authenticate(self, authorization: str | None) -> Principal:
        """Resolve an ``Authorization`` header value (``None``: anonymous).

        Raises :class:`InvalidCredentials` for a header that is not
        ``Bearer <live token>``.
        """
        if authorization is None:
            return Principal.anonymous()
        token = bearer_token(authorization)
        if token is None:
            raise InvalidCredentials("expected an 'Authorization: Bearer <token>' header")
        principal = await self.lookup(token)
        if principal is None:
            raise InvalidCredentials("unknown, revoked or expired token")
        return principal
