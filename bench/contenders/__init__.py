"""The contenders, in table order. Each is a small adapter behind :class:`Contender`."""

from __future__ import annotations

from .agents_sdk import AgentsSQLiteSession
from .base import Contender
from .floors import PythonList, RawSQLiteDeleteFull, RawSQLiteWALFull, RawSQLiteWALNormal
from .flowmem_stores import (
    FlowmemHTTP,
    FlowmemMemory,
    FlowmemPostgres,
    FlowmemRedis,
    FlowmemSQLiteFull,
    FlowmemSQLiteNormal,
)
from .json_blob import JSONBlob
from .langchain_sql import LangChainSQL
from .langgraph_peers import LangGraphAddMessages, LangGraphSqliteSaver

__all__ = ["CONTENDERS", "Contender", "by_name"]

CONTENDERS: tuple[type[Contender], ...] = (
    FlowmemMemory,
    FlowmemSQLiteFull,
    FlowmemSQLiteNormal,
    FlowmemPostgres,
    FlowmemRedis,
    FlowmemHTTP,
    LangGraphAddMessages,
    LangGraphSqliteSaver,
    LangChainSQL,
    AgentsSQLiteSession,
    JSONBlob,
    PythonList,
    RawSQLiteWALNormal,
    RawSQLiteWALFull,
    RawSQLiteDeleteFull,
)


def by_name(name: str) -> type[Contender]:
    for contender in CONTENDERS:
        if contender.name == name:
            return contender
    raise KeyError(f"unknown contender {name!r}; one of {[c.name for c in CONTENDERS]}")
