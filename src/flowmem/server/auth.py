"""Bearer tokens: creation, hashing, and resolving a request to a :class:`Principal`.

Authentication only: WHO calls. What the caller may do is decided by
:mod:`flowmem.access` (like starlette's ``AuthenticationBackend``, this
module never enforces). Tokens are stored HASHED (SHA-256 of a
``secrets.token_urlsafe`` secret) in the store's reserved scope; the token
itself is shown once, when it is created.

A request without an ``Authorization`` header is anonymous: no identity,
owns nothing (MEM-9). A header that is present but not a valid bearer token
is refused (401), never downgraded to anonymous. Identity never comes from
a request body.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Final

from ..access import Principal
from ..errors import InvalidInput
from ..ids import usable_id
from ..store import Store
from .registry import as_mapping, reserved

__all__ = ["TOKEN_PREFIX", "InvalidCredentials", "TokenBackend", "hash_token"]

TOKEN_PREFIX: Final = "fm_"
_TOKENS: Final = "tokens"
_MAX_TOKEN_LENGTH: Final = 256


class InvalidCredentials(Exception):
    """An ``Authorization`` header that is not a valid bearer token (401)."""


def hash_token(token: str) -> str:
    """The stored form of a token: SHA-256, hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class TokenBackend:
    """Creates, revokes and resolves bearer tokens kept in a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, user_id: str, *, admin: bool = False) -> str:
        """A new token for ``user_id`` (a usable id); returns the token, stored hashed."""
        user = usable_id(user_id)
        if user is None or len(user) > 256:
            raise InvalidInput(f"user id must be a usable id of at most 256 characters, "
                               f"got {user_id!r}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = {"user_id": user, "admin": bool(admin), "created_at": time.time()}
        self.store.write(reserved(_TOKENS, hash_token(token)), record)
        return token

    def revoke(self, token: str) -> bool:
        """Forget a token; whether it existed."""
        return self.store.delete(reserved(_TOKENS, hash_token(token)))

    def lookup(self, token: str) -> Principal | None:
        """The principal a token stands for, or ``None`` when it is unknown."""
        if not token or len(token) > _MAX_TOKEN_LENGTH:
            return None
        found, value = self.store.read(reserved(_TOKENS, hash_token(token)))
        record = as_mapping(value) if found else None
        if record is None or usable_id(record.get("user_id")) is None:
            return None
        return Principal(record["user_id"], record.get("admin") is True)

    def authenticate(self, authorization: str | None) -> Principal:
        """Resolve an ``Authorization`` header value (``None``: anonymous).

        Raises :class:`InvalidCredentials` for a header that is not
        ``Bearer <known token>``.
        """
        if authorization is None:
            return Principal.anonymous()
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise InvalidCredentials("expected an 'Authorization: Bearer <token>' header")
        principal = self.lookup(token.strip())
        if principal is None:
            raise InvalidCredentials("unknown or revoked token")
        return principal
