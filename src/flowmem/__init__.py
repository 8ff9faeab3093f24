"""flowmem — conversation memory for LLM agent workflows that is never wrong.

Implements the conversation-memory rules of the FlowDrop Workflow
Specification (GR-MEM, MEM-1 to MEM-16). The core (this package's pure
modules) does no I/O; :class:`Memory` coordinates storage backends.
"""

from __future__ import annotations

from .buffer import AppendResult, ConversationBuffer, append
from .errors import (
    FlowmemError,
    InvalidInput,
    InvalidMessage,
    InvalidStoreURL,
    InvalidValue,
    KeyConflict,
    MessageTypeError,
    MissingDependency,
    SchemaError,
    ScopeRefused,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    UnknownScope,
)
from .ids import usable_id
from .messages import HEALED_CONTENT, ROLES, Message, canonical_message, healed_placeholder
from .scopes import SCOPES, ExecutionContext, StorageKey, resolve_scope

__version__ = "0.1.0"

__all__ = [
    "HEALED_CONTENT",
    "ROLES",
    "SCOPES",
    "AppendResult",
    "ConversationBuffer",
    "ExecutionContext",
    "FlowmemError",
    "InvalidInput",
    "InvalidMessage",
    "InvalidStoreURL",
    "InvalidValue",
    "KeyConflict",
    "Message",
    "MessageTypeError",
    "MissingDependency",
    "SchemaError",
    "ScopeRefused",
    "StorageKey",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
    "UnknownScope",
    "__version__",
    "append",
    "canonical_message",
    "healed_placeholder",
    "resolve_scope",
    "usable_id",
]
