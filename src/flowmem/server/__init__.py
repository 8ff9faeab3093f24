"""``flowmem serve``: the GR-MEM storage API over HTTP (needs ``flowmem[server]``).

See :func:`create_app` and ``docs/http.md``.
"""

from __future__ import annotations

from .app import create_app
from .auth import TokenBackend, hash_token
from .limits import Limits
from .sessions import TRANSCRIPT_KEY, SessionRegistry
from .settings import Settings

__all__ = ["TRANSCRIPT_KEY", "Limits", "SessionRegistry", "Settings", "TokenBackend",
           "create_app", "hash_token"]
