"""The ``flowmem`` command (``python -m flowmem`` runs it too)."""

from __future__ import annotations

from ._main import main

__all__ = ["main"]
