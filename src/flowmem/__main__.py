"""``python -m flowmem``: the ``flowmem`` command."""

from .cli import main

main()
