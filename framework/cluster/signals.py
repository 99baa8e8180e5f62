"""Keep the process's SIGTERM handling through ``ray.init``.

``ray.init`` starts Ray's core worker in this process, and its failure signal handler (absl's)
takes SIGTERM over at the operating-system level: a SIGTERM then aborts the process (exit -6)
instead of reaching the handler the process had (``hetero serve``'s drain). On the main thread
``ray.init`` also sets a Python-level SIGTERM handler of its own (``sys.exit``).
:func:`keeping_sigterm` records the handler in force before and puts it back after: through
:func:`signal.signal` on the main thread, else by restoring the saved ``sigaction`` itself
(libc, so it works from the thread that connects), which Python's ``signal`` module cannot do
off the main thread. Ray's crash handlers for SIGSEGV, SIGABRT and the like stay.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import threading
from collections.abc import Iterator

__all__ = ["keeping_sigterm", "os_handler"]

logger = logging.getLogger(__name__)

_SIGACTION_BYTES = 512  # larger than any libc's struct sigaction: saved and restored opaquely


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sigaction  # noqa: B018 (absent where there is no POSIX libc)
    except (OSError, AttributeError):
        return None
    return libc


def _read(libc: ctypes.CDLL, signum: int) -> ctypes.Array[ctypes.c_char] | None:
    saved = ctypes.create_string_buffer(_SIGACTION_BYTES)
    return saved if libc.sigaction(signum, None, saved) == 0 else None


def os_handler(signum: int) -> int | None:
    """The address of the handler the operating system calls for ``signum`` (None where it
    cannot be read); for tests and diagnostics."""
    libc = _libc()
    saved = _read(libc, signum) if libc is not None else None
    if saved is None:
        return None
    return int.from_bytes(saved.raw[: ctypes.sizeof(ctypes.c_void_p)], "little")


@contextlib.contextmanager
def keeping_sigterm() -> Iterator[None]:
    """Whatever runs inside (``ray.init``) leaves SIGTERM handled as it was before."""
    python_level = signal.getsignal(signal.SIGTERM)
    libc = _libc()
    saved = _read(libc, signal.SIGTERM) if libc is not None else None
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread() and python_level is not None:
            signal.signal(signal.SIGTERM, python_level)  # Python's handler and the OS's, both
        elif libc is not None and saved is not None and libc.sigaction(signal.SIGTERM, saved, None):
            logger.warning("could not restore the SIGTERM handler after connecting to Ray")
