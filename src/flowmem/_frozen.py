"""A faster ``__init__`` for the frozen slotted dataclasses built on every append.

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__`` (a global lookup, an attribute lookup and a generic
``setattr`` per field); calling the slot's own descriptor ``__set__`` does
the same store at about half the cost. :func:`quick_init` swaps in such an
``__init__`` with the dataclass's exact signature (names, order, defaults,
default factories); everything else — frozenness, ``__eq__``, ``__hash__``,
``__repr__``, ``dataclasses.replace`` — is the dataclass's own.
"""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass
from typing import Any, TypeVar

__all__ = ["quick_init"]

C = TypeVar("C", bound=type)

class _Factory:
    """The default of a field with a default factory (shown as the dataclass shows it)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def quick_init(cls: C) -> C:
    """Give the frozen, slotted dataclass ``cls`` a faster ``__init__`` (same signature)."""
    if not is_dataclass(cls) or "__slots__" not in cls.__dict__ \
            or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: quick_init needs a slotted dataclass "
                        "without __post_init__")
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    params, body = ["self"], []
    for item in fields(cls):
        name = item.name
        if not item.init or item.kw_only:
            raise TypeError(f"{cls.__name__}.{name}: quick_init needs plain positional fields")
        namespace[f"_set_{name}"] = cls.__dict__[name].__set__
        if item.default is not MISSING:
            namespace[f"_default_{name}"] = item.default
            params.append(f"{name}=_default_{name}")
        elif item.default_factory is not MISSING:
            namespace[f"_factory_{name}"] = item.default_factory
            params.append(f"{name}=_FACTORY")
            body.append(f"    if {name} is _FACTORY:\n        {name} = _factory_{name}()")
        else:
            params.append(name)
        body.append(f"    _set_{name}(self, {name})")
    source = f"def __init__({', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)  # for inspect and type hints
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses assigning a method
    return cls
