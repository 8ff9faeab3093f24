"""The contenders, in table order. Each is a small adapter behind :class:`Contender`."""

from __future__ import annotations

from . import baselines as b
from . import flowmem_stores as f
from . import peers as p
from .base import Contender

CONTENDERS: tuple[type[Contender], ...] = (
    f.FlowmemMemory, f.FlowmemSQLiteFull, f.FlowmemSQLiteNormal, f.FlowmemPostgres,
    f.FlowmemRedis, p.LangGraphAddMessages, p.LangGraphSqliteSaver, p.LangChainSQL,
    p.AgentsSQLiteSession, b.JSONBlob, b.PythonList, b.RawSQLiteWALNormal, b.RawSQLiteWALFull,
    b.RawSQLiteDeleteFull,
)


def by_name(name: str) -> type[Contender]:
    for contender in CONTENDERS:
        if contender.name == name:
            return contender
    raise KeyError(f"unknown contender {name!r}; one of {[c.name for c in CONTENDERS]}")
