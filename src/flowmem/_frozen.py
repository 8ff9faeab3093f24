"""Faster construction of the frozen slotted dataclasses built on every append.

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__`` (a global lookup, an attribute lookup and a generic
``setattr`` per field); calling the slot's own descriptor ``__set__`` does
the same store at about half the cost. :func:`quick_init` swaps in such an
``__init__`` with the dataclass's exact signature (names, order, defaults,
default factories); everything else — frozenness, ``__eq__``, ``__hash__``,
``__repr__``, ``dataclasses.replace`` — is the dataclass's own.

Even so each field costs a C call. :func:`quick_new` makes a factory for the
hot paths that skips them: it fills an instance of a plain slotted twin of
the class (same slots, so a field is one specialized attribute store), then
makes it an instance of the dataclass by ``__class__`` assignment, which
CPython allows between heap types of the same layout. The result is an
ordinary instance of the dataclass, equal to one built by its constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, ParamSpec, TypeVar, cast

__all__ = ["quick_init", "quick_new"]

C = TypeVar("C", bound=type)
P = ParamSpec("P")
T = TypeVar("T")

class _Factory:
    """The default of a field with a default factory (shown as the dataclass shows it)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _check(cls: type, what: str) -> None:
    """``cls`` is a slotted dataclass of plain positional fields, without ``__post_init__``."""
    if not is_dataclass(cls) or "__slots__" not in cls.__dict__ \
            or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: {what} needs a slotted dataclass "
                        "without __post_init__")
    for item in fields(cls):
        if not item.init or item.kw_only:
            raise TypeError(f"{cls.__name__}.{item.name}: {what} needs plain positional fields")


def _signature(cls: type, namespace: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The parameters of ``cls``'s constructor and the body lines filling default factories;
    ``namespace`` receives the defaults they name."""
    namespace["_FACTORY"] = _FACTORY
    params, body = [], []
    for item in fields(cls):
        name = item.name
        if item.default is not MISSING:
            namespace[f"_default_{name}"] = item.default
            params.append(f"{name}=_default_{name}")
        elif item.default_factory is not MISSING:
            namespace[f"_factory_{name}"] = item.default_factory
            params.append(f"{name}=_FACTORY")
            body.append(f"    if {name} is _FACTORY:\n        {name} = _factory_{name}()")
        else:
            params.append(name)
    return params, body


def quick_init(cls: C) -> C:
    """Give the frozen, slotted dataclass ``cls`` a faster ``__init__`` (same signature)."""
    _check(cls, "quick_init")
    namespace: dict[str, Any] = {}
    params, body = _signature(cls, namespace)
    for item in fields(cls):
        namespace[f"_set_{item.name}"] = cls.__dict__[item.name].__set__
        body.append(f"    _set_{item.name}(self, {item.name})")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(source, namespace)
    init = namespace["__init__"]
    generated = cls.__dict__["__init__"]  # the dataclass's own
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = generated.__doc__
    init.__annotations__ = dict(generated.__annotations__)  # for inspect and type hints
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses assigning a method
    return cls


def quick_new(cls: Callable[P, T]) -> Callable[P, T]:
    """A factory with the signature of the dataclass ``cls`` (as :func:`quick_init` needs
    it, with no base class), about twice as fast as calling ``cls``.

    For the constructions on every append; anything else may call ``cls`` itself.
    """
    kind = cast(type, cls)
    _check(kind, "quick_new")
    if kind.__bases__ != (object,):
        raise TypeError(f"{kind.__name__}: quick_new needs a class with no base class")
    twin = type(f"_{kind.__name__}Twin", (), {"__slots__": kind.__dict__["__slots__"]})
    namespace: dict[str, Any] = {"_twin": twin, "_cls": kind}
    params, body = _signature(kind, namespace)
    body = ["    self = _twin()", *body, *(f"    self.{f.name} = {f.name}" for f in fields(kind)),
            "    self.__class__ = _cls  # same slots: allowed, and the instance is frozen now",
            "    return self"]
    exec(f"def new({', '.join(params)}):\n" + "\n".join(body) + "\n", namespace)
    new = namespace["new"]
    new.__qualname__ = new.__name__ = f"new_{kind.__name__}"
    new.__module__ = kind.__module__
    new.__doc__ = f"A new :class:`{kind.__name__}` (as its constructor; the hot path's)."
    return cast(Callable[P, T], new)
