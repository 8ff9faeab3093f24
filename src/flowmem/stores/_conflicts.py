"""The refusals every store raises when a key holds the other kind, or its scope id is
being erased (one wording)."""

from __future__ import annotations

from ..errors import ErasureInProgress, KeyConflict
from ..scopes import StorageKey

__all__ = ["conversation_conflict", "erasure_refusal"]


def conversation_conflict(key: StorageKey) -> KeyConflict:
    """A plain value written over a conversation without ``replace``: nothing changed."""
    return KeyConflict(f"key {key.key!r} holds a conversation, not a plain value: delete it "
                       "first or write with replace")


def erasure_refusal(key: StorageKey) -> ErasureInProgress:
    """A key not created because its identity scope id is being erased: nothing changed."""
    return ErasureInProgress(
        f"the {key.scope} scope {key.scope_id!r} is being erased: {key.key!r} was not "
        f"created (nothing was written); retry when the erasure has finished")
