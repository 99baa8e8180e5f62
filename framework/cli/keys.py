"""``hetero keys hash``: the salted hash a policy stores for an API key (``api_keys[].hash``).

The key is read from standard input, never from the command line (where ``ps`` shows it);
``--new`` makes a fresh random key and prints it once, above its hash."""

from __future__ import annotations

import secrets
import sys

from rich.console import Console

from hetero.framework.errors import HeteroError


def run_keys_hash(console: Console, new: bool) -> int:
    """Print the hash of the key on stdin (or of a new key, with the key)."""
    from hetero.framework.server.auth import hash_api_key

    if new:
        key = secrets.token_urlsafe(32)
        console.print(f"key:  {key}", highlight=False, soft_wrap=True)
    else:
        key = sys.stdin.readline().rstrip("\r\n")
    try:
        hashed = hash_api_key(key)
    except ValueError as error:
        raise HeteroError(str(error)) from error
    console.print(f"hash: {hashed}" if new else hashed, highlight=False, soft_wrap=True)
    return 0
