"""Where the service keeps its own records: a reserved scope of the store.

Tokens and sessions live in the store's key-value API under the scope
:data:`RESERVED_SCOPE` (``"_flowmem"``). :class:`~flowmem.Memory` only ever
resolves the six GR-MEM scope names (anything else is an
:class:`~flowmem.UnknownScope`), so no memory endpoint can reach them.
"""

from __future__ import annotations

from typing import Any, Final

from ..scopes import StorageKey

__all__ = ["RESERVED_SCOPE", "reserved"]

RESERVED_SCOPE: Final = "_flowmem"


def reserved(scope_id: str, key: str) -> StorageKey:
    """A key of the service's own records (never reachable through ``Memory``)."""
    return StorageKey(RESERVED_SCOPE, scope_id, key)


def as_mapping(value: Any) -> dict[str, Any] | None:
    """A stored record if it is a JSON object, else ``None``."""
    return value if isinstance(value, dict) else None
