"""The public surface, pinned: every name a user can import today stays importable.

As httpx's ``test_exported_members``: the package's layout may change beneath
it (backends as packages, private ``_modules``), the names below may not
disappear. A name added to a module's ``__all__`` is added here on purpose.
"""

from __future__ import annotations

import importlib

import pytest

EXPORTED: dict[str, list[str]] = {
    'flowmem': [
        'AccessHook', 'Action', 'AppendOutcome', 'AppendResult', 'AppendStats', 'AsyncMemory',
        'AsyncStore', 'ConversationBuffer', 'Decision', 'DeleteOutcome', 'DeleteResult',
        'ErasureInProgress', 'ErasureReceipt', 'ExecutionContext',
        'FlowmemError', 'HEALED_CONTENT', 'HistoryPage', 'HistoryResult', 'Idempotency',
        'IdempotencyConflict', 'InvalidInput', 'InvalidMessage', 'InvalidStoreURL',
        'InvalidValue', 'KeyConflict', 'Memory', 'Message', 'MessageTypeError',
        'MessagesNotLoaded', 'MissingDependency', 'NormalizeResult', 'OutcomeUnknown',
        'Principal', 'ROLES', 'ReadResult', 'SCOPES', 'SchemaError', 'ScopeRefused',
        'ScopedAppendResult', 'SessionRecord', 'StorageKey', 'Store', 'StoreBusy', 'StoreError',
        'StoreReadOnly', 'StoreUnavailable', 'SyncCallOnAsyncMemory', 'UnknownScope',
        'WriteResult', '__version__', 'append', 'assemble', 'authorize', 'canonical_message',
        'decide', 'healed_placeholder', 'is_sendable', 'memory_principal', 'normalize', 'owns',
        'resolve_scope', 'sendability_problems', 'text_to_message', 'usable_id',
    ],
    'flowmem.formats': [
        'FORMATS', 'Problem', 'Rendered', 'check', 'check_anthropic', 'check_format',
        'check_openai_chat', 'check_responses', 'from_anthropic', 'from_openai_chat',
        'from_responses', 'opaque_entry', 'opaque_item', 'render', 'render_anthropic',
        'render_openai_chat', 'render_responses', 'to_anthropic', 'to_canonical',
        'to_openai_chat', 'to_responses',
    ],
    'flowmem.context': [
        'ApproximateCounter', 'COMPACTED', 'CompactResult', 'CompactionConflict',
        'CompactionPlan', 'DOCUMENT_TOKENS', 'Fitted', 'IMAGE_TOKENS', 'TiktokenCounter',
        'TokenCounter', 'TokenizerUnavailable', 'approximate', 'compact_entries', 'fit',
        'is_summary', 'plan_compaction', 'tiktoken_unavailable',
    ],
    'flowmem.integrations.langchain': [
        'FlowmemChatMessageHistory', 'LANGCHAIN', 'from_entries', 'from_entry', 'sendable',
        'sendable_messages', 'to_entries', 'to_entry',
    ],
    'flowmem.integrations.langgraph': [
        'MessagesState', 'REMOVE_ALL_MESSAGES', 'add_messages',
    ],
    'flowmem.integrations.agents': [
        'FlowmemSession', 'entry_items',
    ],
    'flowmem.testing': [
        'BlockingStore', 'LoopThread', 'StoreContract', 'StoreModelMachine', 'fresh_key',
        'store_model_test',
    ],
    'flowmem.stores': [
        'DEFAULT_URL', 'open_async_store', 'open_store',
    ],
    'flowmem.server': [
        'Limits', 'SessionRegistry', 'Settings', 'TRANSCRIPT_KEY', 'TokenBackend', 'create_app',
        'hash_token',
    ],
    'flowmem.errors': [
        'ErasureInProgress', 'FlowmemError', 'IdempotencyConflict', 'InvalidInput',
        'InvalidMessage', 'InvalidStoreURL', 'InvalidValue', 'KeyConflict', 'MessageTypeError',
        'MessagesNotLoaded', 'MissingDependency', 'OutcomeUnknown', 'SchemaError', 'ScopeRefused',
        'StoreBusy', 'StoreError', 'StoreReadOnly', 'StoreUnavailable', 'SyncCallOnAsyncMemory',
        'UnknownScope',
    ],
    'flowmem.memory': [
        'DEFAULT_LOCK_TIMEOUT', 'DeleteResult', 'HistoryResult', 'MAX_KEY_LENGTH', 'Memory',
        'ReadResult', 'ScopedAppendResult', 'WriteResult',
    ],
    'flowmem.async_memory': [
        'AsyncMemory',
    ],
    'flowmem.scopes': [
        'ExecutionContext', 'IDENTITY_SCOPES', 'SCOPES', 'StorageKey', 'conversation_key',
        'idempotency_prefix', 'resolve_scope',
    ],
    'flowmem.messages': [
        'HEALED_CONTENT', 'MAX_INT_BITS', 'MAX_JSON_DEPTH', 'Message', 'ROLES',
        'canonical_message', 'canonical_messages', 'coerce_content', 'dialect_mistake',
        'healed_placeholder', 'json_copy',
    ],
    'flowmem.store': [
        'AppendOutcome', 'AppendStats', 'AsyncStore', 'DeleteOutcome', 'Erased', 'HistoryPage',
        'Idempotency', 'Store', 'plan_stats',
    ],
    'flowmem.metrics': [
        'BUCKETS', 'COUNTERS', 'Metrics', 'backend_name',
    ],
    'flowmem.normalize': [
        'NormalizeResult', 'is_sendable', 'normalize', 'repair_pairing', 'sendability_problems',
    ],
    'flowmem.nodes': [
        'assemble', 'text_to_message',
    ],
    'flowmem.buffer': [
        'AppendResult', 'ConversationBuffer', 'append', 'check_max_messages',
    ],
    'flowmem.access': [
        'AccessHook', 'Action', 'Decision', 'Grant', 'Level', 'Principal', 'SESSION_STATUSES',
        'SHARED_SCOPES', 'SessionRecord', 'authorize', 'decide', 'decide_scope',
        'memory_principal', 'owns',
    ],
    'flowmem.ids': [
        'call_entries', 'call_id', 'call_id_field', 'declared_call_ids', 'is_healed',
        'is_key_text', 'nonblank_id', 'result_id', 'usable_id',
    ],
    'flowmem.plan': [
        'AddEntry', 'AppendPlan', 'BufferView', 'HealTurn', 'NewTurn', 'Op', 'PendingCall',
        'ReplacePlaceholder', 'SLOT', 'TurnRef', 'mentioned_ids', 'needs_pending',
        'per_turn_lookups', 'plan_append', 'stored_ids',
    ],
    'flowmem.call_ids': [
        'CALL_ID_POLICIES', 'CallIds', 'PerTurn', 'assign', 'caller_id', 'caller_messages',
        'check_call_ids', 'fingerprint', 'per_turn_ids', 'per_turn_lookups', 'refuse_aliases',
        'stored_edit',
    ],
    'flowmem.results': [
        'DeleteResult', 'HistoryResult', 'ReadResult', 'ScopedAppendResult', 'WriteResult',
        'appended_result',
    ],
    'flowmem.transfer': [
        'BATCH', 'ImportSummary', 'PAGE', 'context_for', 'export_key', 'export_lines',
        'import_lines', 'parse_line', 'scope_keys',
    ],
    'flowmem.pages': [
        'UNPARSED', 'parse_on_read', 'unparsed',
    ],
    'flowmem.entries': [
        'Indexes', 'derive_indexes', 'edit_entries',
    ],
    'flowmem.render': [
        'ROLE_STYLES', 'render_text', 'render_transcript',
    ],
    'flowmem.erasure': [
        'ErasureReceipt', 'KINDS', 'erase_user', 'erased_user_id',
    ],
}

# Where a backend's classes are imported from: each path keeps working.
IMPORTABLE: list[tuple[str, str]] = [
    ("flowmem.stores.memory", "InMemoryStore"),
    ("flowmem.stores.sqlite", "SQLiteStore"),
    ("flowmem.stores.embedded_async", "AsyncInMemoryStore"),
    ("flowmem.stores.embedded_async", "AsyncSQLiteStore"),
    ("flowmem.stores.postgres", "PostgresStore"),
    ("flowmem.stores.postgres_async", "AsyncPostgresStore"),
    ("flowmem.stores.redis", "RedisStore"),
    ("flowmem.stores.redis_async", "AsyncRedisStore"),
    ("flowmem.cli", "main"),
]


@pytest.mark.parametrize("module", sorted(EXPORTED))
def test_exported_members(module: str) -> None:
    """``__all__`` is exactly the pinned list, and every name in it resolves."""
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == EXPORTED[module]
    for name in mod.__all__:
        assert getattr(mod, name) is not None or name.isupper(), name


@pytest.mark.parametrize(("module", "name"), IMPORTABLE)
def test_backend_paths_import(module: str, name: str) -> None:
    """The documented import paths of the store classes and the CLI."""
    assert getattr(importlib.import_module(module), name) is not None

