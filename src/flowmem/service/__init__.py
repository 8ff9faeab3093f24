"""The service's own records, framework-free: sessions, tokens, the reserved scope, changes.

Used by the HTTP service (:mod:`flowmem.server`, which adds FastAPI) and by
the CLI alike, so ``pip install flowmem`` alone runs ``flowmem token …`` and
``flowmem sessions …``. Everything here works over an
:class:`~flowmem.store.AsyncStore`; nothing imports a web framework.
"""

from __future__ import annotations

from ._changes import Changes
from ._erasure import erase_user
from ._registry import RESERVED_SCOPE
from ._sessions import TRANSCRIPT_KEY, SessionRegistry, session_context
from ._tokens import TOKEN_PREFIX, InvalidCredentials, TokenBackend, TokenInfo, hash_token

__all__ = ["RESERVED_SCOPE", "TOKEN_PREFIX", "TRANSCRIPT_KEY", "Changes", "InvalidCredentials",
           "SessionRegistry", "TokenBackend", "TokenInfo", "erase_user", "hash_token",
           "session_context"]
