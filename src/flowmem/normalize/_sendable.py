"""The Sendable invariant (MEM-5), checked on any list: :func:`sendability_problems`
names every breach, :func:`is_sendable` says whether there is none. Flat provider
shape and canonical shape alike: ids are read through :mod:`flowmem.ids`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..call_ids import CallIds, check_call_ids
from ..ids import call_entries, call_id, result_id
from ..messages import ROLES
from ._pairing import as_list

__all__ = ["is_sendable", "sendability_problems"]


class _Checker:
    """Walks a list once and collects every breach of the Sendable invariant (``per_turn``:
    an id may be declared again by a later turn, :func:`~flowmem.normalize.normalize`)."""

    def __init__(self, per_turn: bool = False) -> None:
        self._per_turn = per_turn
        self.problems: list[str] = []
        self._seen_non_system = False
        self._declared: set[str] = set()
        self._answered: set[str] = set()
        self._block: dict[str, bool] | None = None
        self._block_at = -1

    def check(self, index: int, message: Any) -> None:
        if not isinstance(message, Mapping):
            self.problems.append(f"message {index}: not a mapping ({type(message).__name__})")
            self.close_block()
            return
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            self.problems.append(f"message {index}: role {role!r} is not one of {sorted(ROLES)}")
            self.close_block()
            return
        content = message.get("content")
        # OpenAI Chat takes ``content: null`` on an assistant turn that declares calls
        # (what flowmem.formats.to_openai_chat renders, and check_openai_chat accepts)
        if not isinstance(content, str) and not (content is None and role == "assistant"
                                                 and call_entries(message)):
            self.problems.append(f"message {index}: content is not a string")
        if role == "system":
            self._system(index)
        elif role == "tool":
            self._tool(index, message)
        else:
            self.close_block()
            self._seen_non_system = True
            if role == "assistant":
                self._assistant(index, message)

    def _system(self, index: int) -> None:
        if self._seen_non_system:
            self.problems.append(f"message {index}: system message after a non-system message")
        self.close_block()

    def _assistant(self, index: int, message: Mapping[str, Any]) -> None:
        block: dict[str, bool] = {}
        self._block, self._block_at = block, index
        for entry in call_entries(message):
            found = call_id(entry)
            if found is None:
                self.problems.append(f"message {index}: a declared call has no usable id")
            elif found in block or (found in self._declared and not self._per_turn):
                self.problems.append(f"message {index}: call id {found!r} is declared twice")
            else:
                self._answered.discard(found)  # per_turn: a new declaration of the id
                self._declared.add(found)
                block[found] = False

    def _tool(self, index: int, message: Mapping[str, Any]) -> None:
        if not self._seen_non_system:
            self.problems.append(f"message {index}: the first non-system message is a tool result")
            self._seen_non_system = True
        found = result_id(message)
        if found is None:
            self.problems.append(f"message {index}: tool result has no usable id")
        elif found in self._answered:
            self.problems.append(f"message {index}: call id {found!r} is answered twice")
        elif self._block is None or found not in self._block:
            self._answered.add(found)
            self.problems.append(f"message {index}: tool result for {found!r} is not in the "
                                 "block right after the assistant turn declaring it")
        else:
            self._answered.add(found)
            self._block[found] = True

    def close_block(self) -> None:
        if self._block is not None:
            for found, answered in self._block.items():
                if not answered:
                    self.problems.append(f"message {self._block_at}: call id {found!r} has no "
                                         "result in the block after it")
        self._block = None


def sendability_problems(messages: Any, *, call_ids: CallIds = "strict") -> list[str]:
    """Every breach of the Sendable invariant (MEM-5), as readable sentences.

    Sendable: every message is a mapping with one of the four roles and string
    content (``None`` is accepted on an assistant turn that declares calls, as
    OpenAI Chat accepts it); all ``system`` messages come first; the first non-system message
    is not ``tool``; every ``tool`` message sits in the contiguous block right
    after the ``assistant`` turn declaring its id; each declared id has exactly
    one result there; no id is declared twice or answered twice; no declared
    call or tool result has an unusable id. Ids are read through
    :mod:`flowmem.ids`, so the flat and the canonical shape are both accepted.
    An empty list means sendable.

    ``call_ids="per_turn"`` (:mod:`flowmem.call_ids`) accepts an id that a later
    turn declares again, each declaration answered once in its own block (a
    per-turn memory's history, with the caller's ids); ``"strict"`` (the default)
    reports it as declared twice.
    """
    checker = _Checker(check_call_ids(call_ids) == "per_turn")
    for index, message in enumerate(as_list(messages)):
        checker.check(index, message)
    checker.close_block()
    return checker.problems


def is_sendable(messages: Any, *, call_ids: CallIds = "strict") -> bool:
    """Whether ``messages`` satisfies the Sendable invariant (MEM-5) under the call-id
    policy ``call_ids`` (:func:`sendability_problems`)."""
    return not sendability_problems(messages, call_ids=call_ids)
