"""``python -m hetero.framework.cli``."""

from hetero.framework.cli import entry

entry()
