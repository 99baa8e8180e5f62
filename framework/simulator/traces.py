"""Trace files: the documented CSV/JSONL format, and the Azure LLM inference 2023 trace.

**Format.** One request per row (CSV with a header) or per line (JSONL), sorted by arrival:

=================  ========  ==========================================================
column             required  meaning
=================  ========  ==========================================================
``arrival_s``      yes       seconds from the start of the trace, non-negative, sorted
``route``          yes       a route of the policy
``text_tokens``    no        prompt tokens
``output_tokens``  no        tokens to generate
``images``         no        number of images
``image_pixels``   no        pixels per image
``audio_seconds``  no        seconds of audio
``qos``            no        QoS class (the policy's default when empty)
=================  ========  ==========================================================

The Azure trace (``TIMESTAMP,ContextTokens,GeneratedTokens``) is read by :func:`read_azure`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Collection, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from hetero.framework.errors import PolicyValidationError
from hetero.framework.simulator.workload import SimRequest

__all__ = ["TRACE_COLUMNS", "read_azure", "read_trace"]

TRACE_COLUMNS = ("arrival_s", "route")
_INT_COLUMNS = ("text_tokens", "output_tokens", "images", "image_pixels")


def _error(path: Path, line: int, key: str, problem: str) -> PolicyValidationError:
    return PolicyValidationError(str(path), line, key, problem)


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise _error(path, line_number, "", f"not JSON: {err.msg}") from err
                if not isinstance(row, dict):
                    raise _error(path, line_number, "", "each line must be a JSON object")
                missing = [c for c in TRACE_COLUMNS if c not in row]
                if missing:
                    raise _error(path, line_number, "", f"missing column(s): {', '.join(missing)}")
                yield line_number, row
        return
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise _error(path, 1, "", f"missing column(s): {', '.join(missing)}")
        for row in reader:
            yield reader.line_num, row


def _number(path: Path, line: int, row: dict[str, Any], key: str, kind: type) -> Any:
    value = row.get(key)
    if value in (None, ""):
        return kind(0)
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise _error(path, line, key, f"expected a number, got {value!r}") from None
    if number < 0:
        raise _error(path, line, key, f"must not be negative, got {value!r}")
    return number


def read_trace(path: Path, routes: Collection[str], limit: int | None = None) -> list[SimRequest]:
    """Requests from a trace file, checked row by row."""
    if not path.is_file():
        raise _error(path, 0, "", "trace file not found")
    requests: list[SimRequest] = []
    previous = 0.0
    for line, row in _rows(path):
        arrival = _number(path, line, row, "arrival_s", float)
        if arrival < previous:
            raise _error(
                path,
                line,
                "arrival_s",
                f"{arrival} is before the previous row's {previous} (sort by arrival)",
            )
        previous = arrival
        route = str(row["route"])
        if route not in routes:
            raise _error(path, line, "route", f"{route!r} is not a route of the policy")
        counts = {key: _number(path, line, row, key, int) for key in _INT_COLUMNS}
        requests.append(
            SimRequest(
                index=len(requests),
                arrival=arrival,
                route=route,
                qos=str(row["qos"]) if row.get("qos") else None,
                audio_seconds=_number(path, line, row, "audio_seconds", float),
                **counts,
            )
        )
        if limit is not None and len(requests) >= limit:
            break
    return requests


def read_azure(path: Path, limit: int | None = None) -> list[tuple[float, int, int]]:
    """``(arrival seconds from the first row, context tokens, generated tokens)`` per row."""
    if not path.is_file():
        raise _error(path, 0, "", "Azure trace not found")
    rows: list[tuple[float, int, int]] = []
    start: datetime | None = None
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        needed = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise _error(path, 1, "", f"missing column(s): {', '.join(missing)}")
        for row in reader:
            try:
                # Seven fractional digits: datetime takes six.
                stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
                context, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except ValueError as err:
                raise _error(path, reader.line_num, "", f"unreadable row: {err}") from err
            start = start or stamp
            rows.append(((stamp - start).total_seconds(), context, generated))
            if limit is not None and len(rows) >= limit:
                break
    return rows
