"""flowmem — conversation memory for LLM agent workflows that is never wrong.

Implements the conversation-memory rules of the FlowDrop Workflow
Specification (GR-MEM, MEM-1 to MEM-16). The core (this package's pure
modules) does no I/O; :class:`Memory` coordinates storage backends.
"""

from __future__ import annotations

from .access import (
    AccessHook,
    Action,
    Decision,
    Principal,
    SessionRecord,
    authorize,
    decide,
    memory_principal,
    owns,
)
from .async_memory import AsyncMemory
from .buffer import AppendResult, ConversationBuffer, append
from .erasure import ErasureReceipt
from .errors import (
    ErasureInProgress,
    FlowmemError,
    IdempotencyConflict,
    InvalidInput,
    InvalidMessage,
    InvalidStoreURL,
    InvalidValue,
    KeyConflict,
    MessagesNotLoaded,
    MessageTypeError,
    MissingDependency,
    OutcomeUnknown,
    SchemaError,
    ScopeRefused,
    StoreBusy,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
    SyncCallOnAsyncMemory,
    UnknownScope,
)
from .ids import usable_id
from .memory import (
    DeleteResult,
    HistoryResult,
    Memory,
    ReadResult,
    ScopedAppendResult,
    WriteResult,
)
from .messages import HEALED_CONTENT, ROLES, Message, canonical_message, healed_placeholder
from .nodes import assemble, text_to_message
from .normalize import NormalizeResult, is_sendable, normalize, sendability_problems
from .scopes import SCOPES, ExecutionContext, StorageKey, resolve_scope
from .store import (
    AppendOutcome,
    AppendStats,
    AsyncStore,
    DeleteOutcome,
    HistoryPage,
    Idempotency,
    Store,
)

__version__ = "0.2.0"

__all__ = [
    "HEALED_CONTENT",
    "ROLES",
    "SCOPES",
    "AccessHook",
    "Action",
    "AppendOutcome",
    "AppendResult",
    "AppendStats",
    "AsyncMemory",
    "AsyncStore",
    "ConversationBuffer",
    "Decision",
    "DeleteOutcome",
    "DeleteResult",
    "ErasureInProgress",
    "ErasureReceipt",
    "ExecutionContext",
    "FlowmemError",
    "HistoryPage",
    "HistoryResult",
    "Idempotency",
    "IdempotencyConflict",
    "InvalidInput",
    "InvalidMessage",
    "InvalidStoreURL",
    "InvalidValue",
    "KeyConflict",
    "Memory",
    "Message",
    "MessageTypeError",
    "MessagesNotLoaded",
    "MissingDependency",
    "NormalizeResult",
    "OutcomeUnknown",
    "Principal",
    "ReadResult",
    "SchemaError",
    "ScopeRefused",
    "ScopedAppendResult",
    "SessionRecord",
    "StorageKey",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreReadOnly",
    "StoreUnavailable",
    "SyncCallOnAsyncMemory",
    "UnknownScope",
    "WriteResult",
    "__version__",
    "append",
    "assemble",
    "authorize",
    "canonical_message",
    "decide",
    "healed_placeholder",
    "is_sendable",
    "memory_principal",
    "normalize",
    "owns",
    "resolve_scope",
    "sendability_problems",
    "text_to_message",
    "usable_id",
]
