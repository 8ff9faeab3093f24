"""The one reader of identifiers (MEM-11).

Every rule that needs an id reads it here: deduplication (MEM-1, MEM-2),
healing (MEM-3), placeholder replacement (MEM-10), normalization (MEM-5)
and the identity scopes (MEM-6, MEM-13). They share one usability check,
:func:`usable_id`, so no two rules can disagree about what counts as an id.
Text-to-message (MEM-16) is the one rule whose words are weaker ("omitted
when blank"): it reads through :func:`nonblank_id`, which keeps ``"0"``.

A call's id is read from ``tool_call_id`` (our normalized spelling) or ``id``
(the provider-flat spelling), whichever is present and usable. A turn's calls
are under ``tool_calls`` at the top level or inside ``metadata``. A result's
id is ``tool_call_id`` at the top level or inside ``metadata``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "call_entries",
    "call_id",
    "call_id_field",
    "declared_call_ids",
    "is_healed",
    "is_key_text",
    "nonblank_id",
    "result_id",
    "usable_id",
]


_SEQUENCES: Final = (list, tuple)
"""What a ``tool_calls`` field must be (a tuple of types: ``list | tuple`` is built per test)."""


def _id_text(value: Any) -> str | None:
    """``value`` as trimmed id text (an ``int`` cast), or ``None`` for a bool or a non-scalar."""
    kind = type(value)
    if kind is str:
        return str(value).strip()
    if kind is int:
        return str(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    # a subclass of int or str: read as the plain value
    return str(int(value)) if isinstance(value, int) else str.__str__(value).strip()


def usable_id(value: Any) -> str | None:
    """Return ``value`` as a usable id, or ``None`` when it is not one.

    A usable id is a string (an ``int`` is cast) that is not blank after
    trimming and is not ``"0"`` (the spec treats ``"0"`` as no value: MEM-5's
    unusable call id, MEM-6's "no user", MEM-13's "zero" session). A bool
    is never an id, nor is text that no database can hold as a key (a NUL
    character or a lone surrogate), so every backend treats it the same way.
    The result is the trimmed string.
    """
    if value is None:
        return None
    text = value.strip() if type(value) is str else _id_text(value)  # str: without a call
    if not text or text == "0":
        return None
    if text.isascii():
        return None if "\x00" in text else text
    return text if is_key_text(text) else None


def nonblank_id(value: Any) -> str | None:
    """Return ``value`` as a trimmed id unless it is blank (MEM-16), else ``None``.

    Weaker than :func:`usable_id` on purpose: MEM-16 omits a tool call id
    "when blank" and only then, so ``"0"`` (and ``0``, cast) is kept. A bool
    or a non-scalar is no id text at all and is ``None`` too. Pairing rules
    (MEM-1, 2, 3, 5, 10) still read such an id through :func:`usable_id`.
    """
    text = _id_text(value)
    return text or None


def is_key_text(value: str) -> bool:
    """Whether every backend can hold ``value`` as a key: no NUL, no lone surrogate."""
    if "\x00" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _field(message: Mapping[str, Any], name: str) -> Any:
    """A field read at the top level first, then inside ``metadata``."""
    value = message.get(name)
    if value is not None:
        return value
    metadata = message.get("metadata")
    if type(metadata) is dict or isinstance(metadata, Mapping):
        return metadata.get(name)
    return None


def call_entries(message: Mapping[str, Any]) -> list[Any]:
    """The raw call entries a message declares, in declaration order.

    Only an ``assistant`` message declares calls. Returns ``[]`` when there is
    no ``tool_calls`` list.
    """
    if message.get("role") != "assistant":
        return []
    entries = _field(message, "tool_calls")
    if isinstance(entries, _SEQUENCES):
        return list(entries)
    return []


def call_id_field(entry: Any) -> str | None:
    """Which spelling holds a call entry's usable id: ``"tool_call_id"``, ``"id"`` or ``None``.

    The normalized spelling wins when both are present and usable (MEM-11).
    """
    if not isinstance(entry, Mapping):
        return None
    for spelling in ("tool_call_id", "id"):
        if usable_id(entry.get(spelling)) is not None:
            return spelling
    return None


def call_id(entry: Any) -> str | None:
    """The usable id of one declared call entry, from either spelling (MEM-11).

    Reads each spelling once, in :func:`call_id_field`'s order (the hot path).
    """
    if type(entry) is not dict and not isinstance(entry, Mapping):
        return None
    found = usable_id(entry.get("tool_call_id"))
    return usable_id(entry.get("id")) if found is None else found


def declared_call_ids(message: Mapping[str, Any]) -> list[str]:
    """The usable ids a turn declares, in order, each once.

    A turn declaring only unusable ids declares no calls.
    """
    if message.get("role") != "assistant":
        return []
    entries = message.get("tool_calls")  # _field, inlined: this runs per assistant turn
    if entries is None:
        metadata = message.get("metadata")
        if type(metadata) is dict or isinstance(metadata, Mapping):
            entries = metadata.get("tool_calls")
    if type(entries) is not list and not isinstance(entries, _SEQUENCES):
        return []
    ids: list[str] = []
    for entry in entries:  # call_entries and call_id, without the copy and the calls
        if type(entry) is not dict and not isinstance(entry, Mapping):
            continue
        found = entry.get("tool_call_id")  # absent in the provider-flat spelling: no call
        if found is not None:
            found = usable_id(found)
        if found is None:
            found = usable_id(entry.get("id"))
        if found is not None and found not in ids:
            ids.append(found)
    return ids


def result_id(message: Mapping[str, Any]) -> str | None:
    """The usable id a ``tool`` message answers, or ``None``.

    Read at the top level, else inside ``metadata``: an unusable id is absent,
    so it never hides a usable one.
    """
    if message.get("role") != "tool":
        return None
    found = message.get("tool_call_id")  # absent in the canonical shape: no call then
    if found is not None:
        found = usable_id(found)
    if found is None:
        metadata = message.get("metadata")
        if type(metadata) is dict or isinstance(metadata, Mapping):
            found = usable_id(metadata.get("tool_call_id"))
    return found


def is_healed(message: Mapping[str, Any]) -> bool:
    """Whether a message is marked as a healed placeholder (``healed: true``)."""
    value = message.get("healed")  # _field, inlined: this runs per result
    if value is None:
        metadata = message.get("metadata")
        if type(metadata) is dict or isinstance(metadata, Mapping):
            value = metadata.get("healed")
    return value is True
