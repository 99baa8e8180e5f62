"""Human-readable figures for tables."""

from __future__ import annotations

__all__ = ["bytes_text", "rate_text", "seconds_text"]

_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_DECIMAL = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def bytes_text(value: float) -> str:
    """``25.3 GiB``."""
    for unit, size in _BINARY:
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def rate_text(value: float, unit: str) -> str:
    """``2.0 TB/s``, ``312 TFLOPS``."""
    for prefix, size in _DECIMAL:
        if value >= size:
            return f"{value / size:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def seconds_text(value: float) -> str:
    """``1.25 ms``, ``3.2 s``."""
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"
