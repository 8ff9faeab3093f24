"""The one error tree of flowmem.

Every error flowmem raises on purpose is a :class:`FlowmemError`. Errors about
the caller's input also derive from :class:`ValueError` (or :class:`TypeError`
where the input has the wrong type), so code that already catches the builtin
errors keeps working. Storage drivers' own exceptions never escape a store:
they are mapped to :class:`StoreError` subclasses at the store boundary.

::

    FlowmemError
    ├── InvalidInput (ValueError)
    │   ├── InvalidMessage          a message that append refuses (index, field)
    │   │   └── MessageTypeError (TypeError)
    │   ├── InvalidValue            a memory value that is not JSON
    │   ├── UnknownScope            a scope name that does not exist
    │   ├── InvalidStoreURL         a store URL flowmem cannot open
    │   └── KeyConflict             a key that holds the other kind of data
    ├── ScopeRefused                an identity scope without an identity (MEM-6, MEM-13)
    ├── MessagesNotLoaded (RuntimeError)       an AsyncMemory append's buffer, not yet read
    ├── SyncCallOnAsyncMemory (RuntimeError)   a blocking call on an AsyncMemory integration
    └── StoreError                  the storage backend failed
        ├── StoreUnavailable        cannot connect / connection lost; nothing was changed
        │   └── OutcomeUnknown      the answer to a sent change was lost: it may be stored
        ├── StoreBusy               the database stayed locked past its timeout
        ├── StoreReadOnly           a write to a store opened (or only readable) read-only
        ├── SchemaError             the database schema is newer or unusable
        └── MissingDependency (ImportError)   an optional extra is not installed
"""

from __future__ import annotations

__all__ = [
    "ErasureInProgress",
    "FlowmemError",
    "IdempotencyConflict",
    "InvalidInput",
    "InvalidMessage",
    "InvalidStoreURL",
    "InvalidValue",
    "KeyConflict",
    "MessageTypeError",
    "MessagesNotLoaded",
    "MissingDependency",
    "OutcomeUnknown",
    "SchemaError",
    "ScopeRefused",
    "StoreBusy",
    "StoreError",
    "StoreReadOnly",
    "StoreUnavailable",
    "SyncCallOnAsyncMemory",
    "UnknownScope",
]


class FlowmemError(Exception):
    """Base class of every error flowmem raises on purpose."""


class InvalidInput(FlowmemError, ValueError):
    """The caller's input is invalid; nothing was changed."""


class InvalidMessage(InvalidInput):
    """A message that ``append`` refuses.

    ``index`` is the position of the offending message in the list it came in
    (``None`` for a single message) and ``field`` names the offending field.
    """

    def __init__(self, reason: str, *, index: int | None = None, field: str | None = None,
                 where: str = "incoming") -> None:
        self.reason = reason
        self.index = index
        self.field = field
        self.where = where
        location = where if index is None else f"{where}[{index}]"
        if field:
            location = f"{location}.{field}"
        super().__init__(f"{location}: {reason}")


class MessageTypeError(InvalidMessage, TypeError):
    """A message (or a part of it) has a type flowmem cannot store."""


class InvalidValue(InvalidInput):
    """A memory value is not JSON (or is nested deeper than flowmem stores)."""


class UnknownScope(InvalidInput):
    """A scope name that is not one of flowmem's scopes."""


class InvalidStoreURL(InvalidInput):
    """A store URL with an unknown scheme or unusable parts."""


class KeyConflict(InvalidInput):
    """The key holds a plain value where a conversation was expected, or the reverse.

    Nothing was changed. A key holds one kind at a time: an append to a plain
    value, a history of one, or a write over a conversation raise this.
    Replacing one kind by the other is an explicit act: delete the key first,
    or write with ``replace=True`` (``--replace`` on the command line).
    """


class IdempotencyConflict(InvalidInput):
    """An idempotency key already used for a different operation or input.

    A retry must repeat the first request exactly; nothing was changed.
    """


class ScopeRefused(FlowmemError):
    """An identity scope (``user``, ``session``) has no real identity to key on.

    Raised by :func:`flowmem.resolve_scope` (MEM-6, MEM-13). It is a refusal,
    not a fallback: the scope never resolves to the shared bucket ``""``.
    """

    def __init__(self, scope: str, reason: str) -> None:
        self.scope = scope
        self.reason = reason
        super().__init__(f"scope {scope!r} refused: {reason}")


class MessagesNotLoaded(FlowmemError, RuntimeError):
    """``result.messages`` of an :class:`~flowmem.AsyncMemory` append, not yet loaded.

    Reading the buffer is I/O, which a property cannot await: use
    ``await result.load_messages()`` (or ``await memory.history(...)``).
    """


class SyncCallOnAsyncMemory(FlowmemError, RuntimeError):
    """A blocking method of an integration built over an :class:`~flowmem.AsyncMemory`.

    An asyncio store is bound to its event loop, so a blocking call cannot
    run it: use the integration's async methods (``aget_messages``, ...) or
    build it over a :class:`~flowmem.Memory`.
    """


class StoreError(FlowmemError):
    """The storage backend failed; the operation did not take effect.

    Except :class:`OutcomeUnknown`, whose change may have been stored.
    """


class StoreUnavailable(StoreError):
    """The backend cannot be reached, or the connection was lost mid-operation.

    Nothing was changed — except in its subclass :class:`OutcomeUnknown`.
    """


class OutcomeUnknown(StoreUnavailable):
    """The change was sent but its answer was lost: it may or may not have been stored.

    The connection dropped, or a deadline fired, after the store may have
    committed (PostgreSQL: during ``COMMIT``; Redis: during a writing script).
    Retrying with the same ``idempotency_key`` is safe — it stores the change
    once, or replays it if it was stored. Retrying without one may store it
    twice. Every other :class:`StoreError` means nothing was changed.
    """


class StoreBusy(StoreError):
    """The database stayed locked by other writers past its busy timeout."""


class ErasureInProgress(StoreError):
    """An append or write would create a key in a user's (or session's) scope while that
    scope is being erased (:meth:`flowmem.Memory.erase_user`); nothing was written.

    Retry once the erasure has finished: the key is then created anew.
    """


class StoreReadOnly(StoreError):
    """A write to a store that is open read-only; nothing was changed.

    A SQLite store is read-only when opened with ``?mode=ro``, or when this
    process cannot write the database file (it is then opened read-only
    automatically); reads and history work, every write raises this.
    """


class SchemaError(StoreError):
    """The stored schema is newer than this flowmem, or cannot be used."""


class MissingDependency(StoreError, ImportError):
    """An optional dependency is not installed; the message names the extra."""

    def __init__(self, package: str, extra: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(
            f"{package} is not installed: pip install -e '.[{extra}]' in a clone of flowmem "
            f"(or pip install 'flowmem[{extra}]' where flowmem is on your package index)"
        )
