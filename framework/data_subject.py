"""The data subject of a sensitive input: the person it is about, named by the request, so
that erasure by subject (``hetero sandbox erase --subject``) reaches every copy stored of it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SUBJECT_MAX_CHARS", "SubjectData", "subject_problem"]

SUBJECT_MAX_CHARS = 256


@dataclass(frozen=True, slots=True)
class SubjectData:
    """A sensitive input with its data subject. The server builds it from the request for a
    stage that touches a partition; plain ``bytes`` inputs are stored with no subject."""

    data: bytes
    subject: str | None = None


def subject_problem(value: str) -> str | None:
    """Why ``value`` cannot name a data subject (None: it can)."""
    if not value.strip():
        return "must not be blank"
    if len(value) > SUBJECT_MAX_CHARS:
        return f"{len(value)} characters is over the limit of {SUBJECT_MAX_CHARS}"
    if any(not ch.isprintable() for ch in value):
        return "must be printable text"
    return None
