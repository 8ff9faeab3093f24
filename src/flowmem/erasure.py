"""Erasure: a user's data deleted on request, and the receipt that says what went.

:meth:`flowmem.Memory.erase_user` (and :class:`~flowmem.AsyncMemory`'s) deletes
every conversation and value of one user's ``user`` scope, with the
idempotency records kept for them, through :meth:`flowmem.store.Store.erase`,
which makes it safe under concurrent appends (an append racing the erasure is
either erased or refused with :class:`~flowmem.errors.ErasureInProgress`,
never left behind). The HTTP service adds what it keeps about the user
(:mod:`flowmem.service._erasure`: her sessions, tokens, viewer links and
writer records). ``workflow``, ``pipeline``, ``execution`` and ``global``
memories are not per-user and are never erased by it.

The answer is an :class:`ErasureReceipt`: counts per kind, when, for whom,
whether it was a dry run — never any message content.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any, Final

from .errors import InvalidInput
from .ids import usable_id
from .store import Erased, Operation, StoreCall

__all__ = ["KINDS", "ErasureReceipt", "erase_user", "erased_user_id"]

logger = logging.getLogger("flowmem")

KINDS: Final = ("conversations", "values", "messages", "idempotency_records", "sessions",
                "viewer_links", "tokens", "writer_records")
"""The kinds a receipt counts, in the order it lists them."""


@dataclass(frozen=True, slots=True)
class ErasureReceipt:
    """What an erasure deleted (``dry_run``: would delete), for whom and when.

    ``conversations``, ``values``, ``messages`` and ``idempotency_records`` are
    the user's own scope (and, from the service, her sessions' scopes);
    ``sessions`` the session records she owned, ``viewer_links`` the links
    that let her view a session (or let others view hers), ``tokens`` her
    bearer tokens, ``writer_records`` the records naming her as the last
    writer of a shared value (the value itself stays: it is not hers alone).
    ``erased_at`` is seconds since the epoch. A receipt holds no content.
    """

    user_id: str
    erased_at: float
    dry_run: bool = False
    conversations: int = 0
    values: int = 0
    messages: int = 0
    idempotency_records: int = 0
    sessions: int = 0
    viewer_links: int = 0
    tokens: int = 0
    writer_records: int = 0

    @property
    def counts(self) -> dict[str, int]:
        """Every kind and its count, in :data:`KINDS` order."""
        return {kind: int(getattr(self, kind)) for kind in KINDS}

    @property
    def total(self) -> int:
        """Everything counted."""
        return sum(self.counts.values())

    def adding(self, erased: Erased | None = None, **counts: int) -> ErasureReceipt:
        """This receipt with a store's :class:`~flowmem.store.Erased` and ``counts`` added."""
        more = asdict(erased) if erased is not None else {}
        for kind, count in counts.items():
            more[kind] = more.get(kind, 0) + count
        return replace(self, **{kind: getattr(self, kind) + count
                                for kind, count in more.items()})

    def to_json(self) -> dict[str, Any]:
        """The receipt as JSON: ``user_id``, ``erased_at`` (ISO 8601, UTC), ``dry_run``,
        ``counts`` and ``total``."""
        return {"user_id": self.user_id,
                "erased_at": datetime.fromtimestamp(self.erased_at, UTC).isoformat(),
                "dry_run": self.dry_run, "counts": self.counts, "total": self.total}


assert {f.name for f in fields(ErasureReceipt)} >= set(KINDS)


def erased_user_id(user_id: Any) -> str:
    """The user id an erasure names: a usable id (MEM-6), else :class:`InvalidInput`."""
    usable = usable_id(user_id)
    if usable is None:
        raise InvalidInput(f"erase_user needs a user id (a non-empty string or a non-zero "
                           f"integer), got {user_id!r}")
    return usable


def erase_user(user_id: Any, dry_run: bool, clock: Any = time.time,
               ) -> Operation[ErasureReceipt]:
    """The operation behind ``erase_user`` on both faces: one store call."""
    user = erased_user_id(user_id)
    if not isinstance(dry_run, bool):
        raise InvalidInput(f"dry_run must be True or False, got {dry_run!r}")
    erased: Erased = yield StoreCall("erase", ("user", user), {"dry_run": dry_run})
    receipt = ErasureReceipt(user, float(clock()), dry_run).adding(erased)
    log(receipt, "user scope")
    return receipt


def log(receipt: ErasureReceipt, what: str) -> None:
    """One line for the service log: who, which counts (never content)."""
    counts = " ".join(f"{kind}={count}" for kind, count in receipt.counts.items() if count)
    logger.info("flowmem: erasure%s of user %r, %s: %s",
                " (dry run)" if receipt.dry_run else "", receipt.user_id, what,
                counts or "nothing")
