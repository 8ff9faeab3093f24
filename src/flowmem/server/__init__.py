"""``flowmem serve``: the GR-MEM storage API over HTTP (needs ``flowmem[server]``).

See :func:`create_app` and ``docs/http.md``.
"""

from __future__ import annotations

from ..service._sessions import TRANSCRIPT_KEY, SessionRegistry
from ..service._tokens import TokenBackend, hash_token
from ._app import create_app
from ._limits import Limits
from ._settings import Settings

__all__ = ["TRANSCRIPT_KEY", "Limits", "SessionRegistry", "Settings", "TokenBackend",
           "create_app", "hash_token"]
