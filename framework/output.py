"""Machine-readable output: every command with ``--json`` (``hetero bench`` included, and
``hetero run``) prints through :func:`print_json`, so scripts and tests read data, never the
tables drawn for people. Below the CLI and the bench alike, so neither imports the other for it."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

__all__ = ["print_json"]


def print_json(console: Console, payload: Any) -> None:
    """Print ``payload`` as one indented JSON document, as is: no colour (not even under
    ``FORCE_COLOR``), no markup or emoji codes, no wrapping at the terminal's width."""
    # Straight to the console's file: rich would cut a large document into a Text per line
    # first (a 1,000-device fleet's topology took seconds there).
    console.file.write(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    console.file.flush()
