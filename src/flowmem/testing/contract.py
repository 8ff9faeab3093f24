"""The conformance suite every :class:`~flowmem.store.Store` runs.

Subclass :class:`StoreContract` and provide a ``store`` fixture; optionally a
``reopen`` fixture (a callable opening a second store over the same data, or
``None`` for a store that keeps nothing). Every test works under its own
fresh key, so a shared database needs no cleaning between tests.

Each test names the GR-MEM rule it checks; the expected buffers come from the
pure model, :func:`flowmem.append`, never from a second implementation.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from ..buffer import append as model_append
from ..errors import InvalidInput, KeyConflict
from ..messages import HEALED_CONTENT, Message, canonical_messages
from ..scopes import StorageKey
from ..store import DeleteOutcome, Idempotency, Store
from ._contract_messages import assistant, fresh_key, tool, user
from ._contract_retries import RetryContract
from .contract_call_ids import CallIdsContract
from .contract_erasure import ErasureContract
from .contract_retention import RetentionContract
from .contract_tail import TailContract

__all__ = ["StoreContract", "fresh_key"]


def _append(store: Store, key: StorageKey, incoming: list[Message],
            window: int | None = None) -> tuple[int, int]:
    outcome = store.append(key, canonical_messages(incoming), max_messages=window,
                           lock_timeout=5.0)
    return outcome.count, outcome.appended


def _messages(store: Store, key: StorageKey) -> list[Message]:
    found, value = store.read(key)
    assert found, f"{key} not found"
    assert isinstance(value, list)
    return value


class StoreContract(RetryContract, TailContract, RetentionContract, CallIdsContract,
                    ErasureContract):
    """Conformance tests; subclass and provide the ``store`` fixture."""

    @pytest.fixture
    def reopen(self) -> Callable[[], Store] | None:
        """Override to return a callable opening the same data again."""
        return None

    # -- values ------------------------------------------------------------------
    def test_read_missing_key(self, store: Store) -> None:
        assert store.read(fresh_key()) == (False, None)

    def test_write_read_replace_delete(self, store: Store) -> None:
        key = fresh_key()
        store.write(key, {"a": [1, 2.5, None, True], "b": "x"})
        assert store.read(key) == (True, {"a": [1, 2.5, None, True], "b": "x"})
        store.write(key, "second")
        assert store.read(key) == (True, "second")
        assert store.delete(key) == DeleteOutcome(found=True, replayed=False)
        assert store.read(key) == (False, None)
        assert store.delete(key) == DeleteOutcome(found=False, replayed=False)

    def test_values_keep_nul_surrogates_and_unicode(self, store: Store) -> None:
        key = fresh_key()
        value = {"text": "a\u0000b \ud800 é 漢 🙂", "nested": [{"\u0000k": "\udfff"}]}
        store.write(key, value)
        assert store.read(key) == (True, value)

    def test_scopes_and_keys_are_isolated(self, store: Store) -> None:
        base = fresh_key()
        others = [StorageKey("user", base.scope_id, base.key),
                  StorageKey(base.scope, base.scope_id + "x", base.key),
                  StorageKey(base.scope, base.scope_id, base.key + "x")]
        store.write(base, "mine")
        _append(store, others[0], [user("theirs")])
        for other in others[1:]:
            assert store.read(other) == (False, None)
        assert store.read(base) == (True, "mine")
        assert _messages(store, others[0])[0]["content"] == "theirs"

    def test_keys_lists_values_and_conversations(self, store: Store) -> None:
        base = fresh_key()
        for name in ("b", "a", "c", "ab"):
            store.write(StorageKey(base.scope, base.scope_id, name), name)
        _append(store, StorageKey(base.scope, base.scope_id, "aa"), [user("x")])
        assert store.keys(base.scope, base.scope_id) == ["a", "aa", "ab", "b", "c"]
        assert store.keys(base.scope, base.scope_id, prefix="a") == ["a", "aa", "ab"]
        assert store.keys(base.scope, base.scope_id, after="aa", limit=2) == ["ab", "b"]
        assert store.keys(base.scope, base.scope_id + "-none") == []

    def test_keys_cover_the_whole_code_point_range(self, store: Store) -> None:
        base = fresh_key()
        top = "\U0010ffff"
        names = ["a", "\ud7ff", "\ue000", top, top + "a", "a" + top, "a" + top + "b"]
        for name in names:
            store.write(StorageKey(base.scope, base.scope_id, name), 1)
        listed = store.keys(base.scope, base.scope_id)
        assert listed == sorted(names)
        assert store.keys(base.scope, base.scope_id, prefix=top) == [top, top + "a"]
        assert store.keys(base.scope, base.scope_id, prefix="a" + top) == ["a" + top,
                                                                          "a" + top + "b"]
        assert store.keys(base.scope, base.scope_id, prefix="\ud7ff") == ["\ud7ff"]

    # -- conversations ---------------------------------------------------------------
    def test_conversation_reads_as_its_messages(self, store: Store) -> None:
        key = fresh_key()
        incoming = [{"role": "system", "content": "be brief"}, user("hi"),
                    {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}]
        assert _append(store, key, incoming) == (3, 3)
        assert _messages(store, key) == model_append([], incoming).messages

    def test_mem1_refired_result_stored_once(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [user("q"), assistant("c1"), tool("c1", "first")])
        assert _append(store, key, [tool("c1", "again")]) == (3, 0)
        assert [m["content"] for m in _messages(store, key)][-1] == "first"

    def test_mem2_assistant_dropped_only_when_every_id_known(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [assistant("a", "b"), tool("a"), tool("b")])
        assert _append(store, key, [assistant("a", "b")]) == (3, 0)
        assert _append(store, key, [assistant("b", "c")]) == (4, 1)

    def test_mem3_heals_after_the_block_not_at_the_end(self, store: Store) -> None:
        key = fresh_key()
        first = [user("q"), assistant("c1", "c2", "c3"), tool("c2"), user("then?"),
                 assistant("d1"), tool("d1")]
        _append(store, key, first[:3])
        count, appended = _append(store, key, first[3:])
        expected = model_append(model_append([], first[:3]).messages, first[3:])
        assert (count, appended) == (expected.count, 3)
        stored = _messages(store, key)
        assert stored == expected.messages
        assert [m["metadata"].get("tool_call_id") for m in stored[2:5]] == ["c2", "c1", "c3"]
        assert stored[3]["content"] == HEALED_CONTENT

    def test_mem3_tool_and_assistant_appends_never_heal(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [assistant("c1")])
        _append(store, key, [assistant("c2"), {"role": "system", "content": "s"}])
        assert all(m["role"] != "tool" for m in _messages(store, key))

    def test_mem10_late_result_replaces_placeholder_in_place(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [assistant("c1"), user("next")])
        before = _messages(store, key)
        assert _append(store, key, [tool("c1", "Found 3 cats")]) == (3, 0)
        after = _messages(store, key)
        assert after[1] == {"role": "tool", "content": "Found 3 cats",
                            "metadata": {"tool_call_id": "c1"}}
        assert after[0] == before[0] and after[2] == before[2]
        assert _append(store, key, [tool("c1", "again")]) == (3, 0)
        assert _messages(store, key) == after

    def test_mem10_incoming_healed_never_replaces(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [assistant("c1"), user("next")])
        assert _append(store, key, [tool("c1", "x", healed=True)]) == (3, 0)
        assert _messages(store, key)[1]["content"] == HEALED_CONTENT
        assert _append(store, key, [tool("zz", "x", healed=True)]) == (4, 1)

    def test_mem11_both_spellings_are_one_id(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [assistant("c1", spelling="tool_call_id"), tool("c1")])
        assert _append(store, key, [assistant("c1", spelling="id")]) == (2, 0)
        _append(store, key, [{"role": "assistant", "content": "",
                              "metadata": {"tool_calls": [{"id": "call_1"}]}}, user("u")])
        healed = _messages(store, key)[3]
        assert healed["metadata"] == {"tool_call_id": "call_1", "healed": True}

    def test_mem14_window_reports_appended_not_growth(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [user("1"), user("2"), user("3")], window=3)
        assert _append(store, key, [user("4")], window=3) == (3, 1)
        assert [m["content"] for m in _messages(store, key)] == ["2", "3", "4"]

    def test_window_evicts_a_turn_with_its_results(self, store: Store) -> None:
        key = fresh_key()
        incoming = [user("q"), assistant("c1", "c2"), tool("c1"), user("late"), tool("c2")]
        _append(store, key, incoming)
        count, appended = _append(store, key, [user("x")], window=4)
        expected = model_append(model_append([], incoming).messages, [user("x")], max_messages=4)
        assert (count, appended) == (expected.count, 1)
        assert _messages(store, key) == expected.messages

    def test_append_is_all_or_nothing_on_conflict(self, store: Store) -> None:
        key = fresh_key()
        store.write(key, {"plain": True})
        with pytest.raises(KeyConflict):
            _append(store, key, [user("x")])
        assert store.read(key) == (True, {"plain": True})
        conversation = StorageKey(key.scope, key.scope_id, "c")
        _append(store, conversation, [user("x")])
        store.write(conversation, 7, replace=True)  # the explicit act
        assert store.read(conversation) == (True, 7)

    def test_a_value_over_a_conversation_is_a_key_conflict(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [user("x"), user("y")])
        before = store.read(key)
        guarded = Idempotency(key=f"w-{key.key}", fingerprint="f", ttl=60.0, now=time.time())
        for idempotency in (None, guarded):
            with pytest.raises(KeyConflict):
                store.write(key, {"a": 1}, idempotency=idempotency)
            assert store.read(key) == before  # nothing changed, the conversation is whole
        # the refused write recorded nothing: the same key now applies once the way is clear
        assert store.delete(key).found
        store.write(key, {"a": 1}, idempotency=guarded)
        assert store.read(key) == (True, {"a": 1})
        store.write(key, {"a": 2})  # a value over a value needs nothing
        assert store.read(key) == (True, {"a": 2})

    def test_messages_keep_nul_surrogates_and_structure(self, store: Store) -> None:
        key = fresh_key()
        content = [{"type": "text", "text": "a\u0000b\ud800"}, {"type": "image_url",
                                                                 "image_url": {"url": "x"}}]
        _append(store, key, [{"role": "user", "content": content, "name": "ann"}])
        stored = _messages(store, key)[0]
        assert stored == {"role": "user", "content": content, "metadata": {"name": "ann"}}

    # -- history and edits ----------------------------------------------------------
    def test_history_of_a_plain_value_is_a_key_conflict(self, store: Store) -> None:
        key = fresh_key()
        store.write(key, [])
        with pytest.raises(KeyConflict):
            store.history(key)

    def test_history_pages_backwards(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [user(str(i)) for i in range(7)])
        page = store.history(key, last=3)
        assert [m["content"] for m in page.messages] == ["4", "5", "6"]
        assert page.before is not None
        older = store.history(key, last=3, before=page.before)
        assert [m["content"] for m in older.messages] == ["1", "2", "3"]
        oldest = store.history(key, last=3, before=older.before)
        assert [m["content"] for m in oldest.messages] == ["0"]
        assert oldest.before is None
        assert store.history(fresh_key()).messages == []
        assert page.total in (None, 7)  # the whole conversation (None: a store that cannot count)
        assert older.total in (None, 4) and oldest.total in (None, 1)  # older than the cursor
        for each in (page, older, oldest, store.history(key)):  # the texts, when given
            assert each.encoded is None or [json.loads(t) for t in each.encoded] == each.messages
            assert each.encoded is None or all(t.isascii() for t in each.encoded)

    def test_positions_are_stable_across_healing(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [assistant("c1"), user("a")])
        first = store.history(key)
        _append(store, key, [assistant("c2"), user("b")])
        second = store.history(key)
        assert second.positions[:3] == first.positions
        assert second.positions == sorted(second.positions)

    def test_mem15_edit_replaces_and_deletes_with_indexes(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [assistant("c1"), tool("c1", "r"), user("u")])
        positions = store.history(key).positions
        assert store.edit(key, positions[2], {"role": "user", "content": "edited"})
        assert _messages(store, key)[2]["content"] == "edited"
        assert store.edit(key, positions[1], None)
        assert len(_messages(store, key)) == 2
        _append(store, key, [user("again")])  # c1 lost its result: healed again
        assert _messages(store, key)[1]["content"] == HEALED_CONTENT
        assert not store.edit(key, 12345, None)
        assert not store.edit(fresh_key(), 0, None)

    def test_mem15_edit_never_stores_a_result_twice(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [assistant("c1"), tool("c1", "r"), user("u")])
        positions = store.history(key).positions
        with pytest.raises(InvalidInput):
            store.edit(key, positions[2], tool("c1", "second"))
        assert [m["content"] for m in _messages(store, key)] == [None, "r", "u"]
        assert store.edit(key, positions[1], tool("c1", "corrected"))
        assert _messages(store, key)[1]["content"] == "corrected"

    def test_mem15_edit_keeps_the_role_so_healing_positions_stay_free(self, store: Store) -> None:
        key = fresh_key()
        _append(store, key, [user("q"), assistant("c1", "c2"), user("u")])
        positions = store.history(key).positions
        before = _messages(store, key)
        with pytest.raises(InvalidInput):
            store.edit(key, positions[3], user("was a placeholder"))
        assert _messages(store, key) == before
        assert store.edit(key, positions[3], None)
        _append(store, key, [user("v")])  # c2 healed again, into the freed position
        assert [m["role"] for m in _messages(store, key)] == ["user", "assistant", "tool", "tool",
                                                             "user", "user"]

    # -- compaction (flowmem.context): one administrative edit ------------------------
    def test_compaction_replaces_its_range_in_one_edit(self, store: Store) -> None:
        from ..context import CompactionConflict, approximate, plan_compaction
        from ..context._compact import summary_message

        key = fresh_key()
        _append(store, key, [{"role": "system", "content": "be brief"}, user("a"),
                             assistant("c1"), tool("c1"), user("b"), assistant("c2")])
        _append(store, key, [user("c")])  # heals c2
        page = store.history(key)
        entries = list(zip(page.positions, page.messages, strict=True))
        plan = plan_compaction(key, entries, keep_last=1, keep_last_tokens=None,
                               counter=approximate, format="canonical")
        assert plan is not None and len(plan.messages) == 6
        summary = summary_message(plan, "a, then b", "k")
        stale = {**summary, "metadata": {"compacted": {
            **summary["metadata"]["compacted"], "digest": "0" * 64}}}
        with pytest.raises(CompactionConflict):
            store.edit(key, plan.positions[0], stale)
        assert _messages(store, key) == page.messages  # refused whole: nothing changed
        assert store.edit(key, plan.positions[0], summary)
        after = store.history(key)
        assert [m["role"] for m in after.messages] == ["system", "system", "user"]
        assert after.positions == [page.positions[0], plan.positions[0], page.positions[-1]]
        assert after.messages[1]["metadata"]["compacted"]["count"] == 6
        _append(store, key, [tool("c1", "late")])  # its call was compacted: a plain result
        _append(store, key, [assistant("c1")])  # MEM-2: c1 is no longer declared here
        assert [m["role"] for m in _messages(store, key)][-2:] == ["tool", "assistant"]

    # -- concurrency (MEM-12) ---------------------------------------------------------
    def test_mem12_held_lock_times_out_into_unserialized_append(self, store: Store) -> None:
        key = fresh_key()
        with store.lock(key, 1.0) as held:
            assert held
            result: dict[str, Any] = {}

            def writer() -> None:
                result["outcome"] = store.append(key, canonical_messages([user("x")]),
                                                 max_messages=None, lock_timeout=0.05)

            thread = threading.Thread(target=writer)
            thread.start()
            thread.join(10)
        assert not thread.is_alive()
        assert result["outcome"].serialized is False
        assert result["outcome"].appended == 1
        assert len(_messages(store, key)) == 1

    def test_mem12_threads_lose_and_double_nothing(self, store: Store) -> None:
        key = fresh_key()
        per_thread = 25

        def writer(name: str) -> None:
            for i in range(per_thread):
                _append(store, key, [assistant(f"{name}-{i}"), tool(f"{name}-{i}")])
                _append(store, key, [tool(f"{name}-{i}", "refired")])

        threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stored = _messages(store, key)
        results = [m["metadata"]["tool_call_id"] for m in stored if m["role"] == "tool"]
        assert len(stored) == 4 * per_thread * 2
        assert len(results) == len(set(results)) == 4 * per_thread

    # -- persistence --------------------------------------------------------------------
    def test_reopen_keeps_everything(self, store: Store,
                                     reopen: Callable[[], Store] | None) -> None:
        if reopen is None:
            pytest.skip("this backend keeps nothing across instances")
        key = fresh_key()
        _append(store, key, [assistant("c1"), user("u")])
        store.write(StorageKey(key.scope, key.scope_id, "v"), [1, "two"])
        again = reopen()
        try:
            assert again.read(key) == store.read(key)
            assert again.read(StorageKey(key.scope, key.scope_id, "v")) == (True, [1, "two"])
            assert again.append(key, canonical_messages([tool("c1", "late")]),
                                max_messages=None, lock_timeout=5.0).appended == 0
        finally:
            again.close()
