"""A store URL's query: flowmem's own options taken out and typed, the rest left to the driver.

Every backend reads its options through :class:`URLOptions`, so every URL
speaks one language: the last value of a repeated option wins, a boolean is
``yes|no|true|false|on|off|1|0``, seconds are a finite number, and a bad
value is one :class:`~flowmem.errors.InvalidStoreURL` naming the option and
the URL. What flowmem does not own stays in the query for the driver (libpq,
redis-py); a backend without a driver's options refuses unknown names.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Final, overload
from urllib.parse import SplitResult, parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ..errors import InvalidStoreURL

__all__ = ["URLOptions"]

_BOOLEANS: Final = {"yes": True, "true": True, "on": True, "1": True,
                    "no": False, "false": False, "off": False, "0": False}


class URLOptions:
    """The options named ``ours`` of ``url``; everything else is :attr:`rest`."""

    def __init__(self, url: str, ours: Collection[str]) -> None:
        self.url = url
        self.parts: SplitResult = urlsplit(url)
        query = parse_qsl(self.parts.query, keep_blank_values=True)
        self.given: dict[str, str] = {name: value for name, value in query if name in ours}
        self.repeated: list[tuple[str, str]] = [(n, v) for n, v in query if n in ours]
        self.rest: list[tuple[str, str]] = [(n, v) for n, v in query if n not in ours]

    def refuse_unknown(self, backend: str, known: Collection[str]) -> None:
        """A backend that passes nothing on: every other name is a mistake."""
        unknown = sorted({name for name, _ in self.rest})
        if unknown:
            raise InvalidStoreURL(f"unknown {backend} option(s): {', '.join(unknown)} "
                                  f"(known options: {', '.join(known)})")

    def url_for_driver(self, netloc: str | None = None) -> str:
        """The URL without flowmem's options (``%20``, not ``+``: libpq decodes escapes only)."""
        parts = self.parts if netloc is None else self.parts._replace(netloc=netloc)
        return urlunsplit(parts._replace(query=urlencode(self.rest, quote_via=quote),
                                         fragment=""))

    def _bad(self, name: str, what: str) -> InvalidStoreURL:
        return InvalidStoreURL(f"{name} must be {what}, in {self.url!r}")

    def text(self, name: str, default: str) -> str:
        """A string option."""
        return self.given.get(name, default)

    def choice(self, name: str, default: str, allowed: Collection[str]) -> str:
        """One of ``allowed`` (case-insensitive)."""
        value = self.given.get(name, default).lower()
        if value not in allowed:
            raise self._bad(name, " or ".join(sorted(allowed)))
        return value

    def boolean(self, name: str, default: bool | None) -> bool | None:
        """yes/no, true/false, on/off or 1/0; ``default`` when absent."""
        if name not in self.given:
            return default
        value = _BOOLEANS.get(self.given[name].lower())
        if value is None:
            raise self._bad(name, "yes or no (true/false, on/off, 1/0)")
        return value

    def seconds(self, name: str, default: float, *, positive: bool = False) -> float:
        """A finite number of seconds, ``>= 0`` (``> 0`` when ``positive``)."""
        try:
            value = float(self.given.get(name, default))
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise self._bad(name, f"a number of seconds {'> 0' if positive else '>= 0'}")
        return value

    @overload
    def integer(self, name: str, default: int, low: int, high: int) -> int: ...
    @overload
    def integer(self, name: str, default: None, low: int, high: int) -> int | None: ...

    def integer(self, name: str, default: int | None, low: int, high: int) -> int | None:
        """A whole number in ``[low, high]``; ``default`` when absent."""
        if name not in self.given:
            return default
        text = self.given[name]
        if not text.isdigit() or not low <= int(text) <= high:
            raise self._bad(name, f"a whole number from {low} to {high}")
        return int(text)
