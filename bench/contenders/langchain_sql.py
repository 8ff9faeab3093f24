"""LangChain ``SQLChatMessageHistory`` on a SQLite file (langchain-community, SQLAlchemy).

``add_message`` opens a SQLAlchemy session, inserts one row (the message as
``message_to_dict`` JSON) and commits: one transaction per append. The
engine is SQLAlchemy's default for ``sqlite:///``, which keeps SQLite's own
defaults: rollback journal (``journal_mode=DELETE``), ``synchronous=FULL``.
``messages`` reads the whole session; there is no API for the last N, so
``read_last`` reads everything and slices. Prefill: ``add_messages`` (one
commit). Nothing deduplicates re-fired results or heals interrupted calls.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import Contender, missing_modules
from .langgraph_peers import from_langchain, to_langchain

__all__ = ["LangChainSQL"]


class LangChainSQL(Contender):
    name = "langchain-sql"
    label = "LangChain SQLChatMessageHistory (SQLite)"
    durability = "rollback journal (DELETE), synchronous=FULL (SQLite's defaults)"
    notes = ("SQLAlchemy session + commit per `add_message`; no last-N read, so the last "
             "50 cost a full read.")

    @classmethod
    def unavailable(cls) -> str | None:
        return missing_modules("langchain_community", "sqlalchemy", "greenlet",
                               "langchain_core")

    def convert(self, messages: Sequence[dict[str, Any]]) -> list[Any]:
        return to_langchain(messages)

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        from sqlalchemy import create_engine

        super().open(workdir)
        self.engine = create_engine(f"sqlite:///{workdir / 'langchain.db'}")
        self.histories: dict[str, Any] = {}

    def _history(self, conversation: str) -> Any:
        history = self.histories.get(conversation)
        if history is None:
            from langchain_community.chat_message_histories import SQLChatMessageHistory

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                history = SQLChatMessageHistory(session_id=conversation, connection=self.engine)
            self.histories[conversation] = history
        return history

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        self._history(conversation).add_messages(list(items))

    def append(self, conversation: str, item: Any) -> None:
        self._history(conversation).add_message(item)

    def read_all(self, conversation: str) -> Any:
        return self._history(conversation).messages

    def read_last(self, conversation: str, n: int) -> Any:
        return self._history(conversation).messages[-n:]

    def to_openai(self, history: Any) -> list[dict[str, Any]]:
        return from_langchain(history)

    def close(self) -> None:
        for history in self.histories.values():
            history.session_maker.remove()
        self.engine.dispose()
