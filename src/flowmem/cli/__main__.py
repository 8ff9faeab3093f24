"""``python -m flowmem.cli``."""

from . import main

main()
