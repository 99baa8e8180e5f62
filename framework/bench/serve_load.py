"""The closed-loop load of ``hetero bench serve``, the peers harness's method.

``concurrency`` workers share one httpx client; each sends its next request as soon as the
previous one returns. After a warm-up, requests that *start* inside the window are measured; when
the window closes no new request is sent and those in flight are awaited. Throughput counts the OK
responses completed inside the window; latency is client-side, send to full response.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from hetero.framework.bench.serve_mix import BenchRequest, RequestMix

__all__ = ["Record", "closed_loop", "inprocess_loop", "median_point", "summarize"]

ROUTES = ("/embed", "/vision")
MAX_ERROR_SAMPLES = 5


@dataclass(frozen=True, slots=True)
class Record:
    """One measured request."""

    route: str
    started: float
    ended: float
    ok: bool


def _figures(records: list[Record], window_end: float, seconds: float) -> dict[str, Any]:
    latencies = np.array([(r.ended - r.started) * 1000.0 for r in records if r.ok])
    done = sum(1 for r in records if r.ok and r.ended <= window_end)
    return {
        "requests": len(records),
        "errors": sum(1 for r in records if not r.ok),
        "req_s": round(done / seconds, 1),
        "p50_ms": round(float(np.percentile(latencies, 50)), 1) if latencies.size else None,
        "p99_ms": round(float(np.percentile(latencies, 99)), 1) if latencies.size else None,
    }


def summarize(records: list[Record], window_end: float, seconds: float) -> dict[str, Any]:
    """req/s, p50 and p99 in ms, requests and errors: overall and per route (``/embed`` and
    ``/vision`` always, any other route sent to as well), keyed by the route's last segment
    (``embed``, or ``ocr`` for ``/v1/pipelines/ocr``)."""
    out = _figures(records, window_end, seconds)
    sent = sorted({r.route for r in records} - set(ROUTES))
    out["routes"] = {
        route.rsplit("/", 1)[-1]: _figures(
            [r for r in records if r.route == route], window_end, seconds
        )
        for route in (*ROUTES, *sent)
    }
    return out


async def _closed_loop(
    url: str,
    groups: Sequence[tuple[RequestMix, int]],
    warmup_s: float,
    seconds: float,
    timeout_s: float,
) -> dict[str, Any]:
    streams = [mix.stream(index) for mix, count in groups for index in range(count)]
    concurrency = len(streams)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"content-type": "application/json"}
    records: list[Record] = []
    errors: list[str] = []
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=timeout_s, trust_env=False
    ) as client:
        start = time.perf_counter() + warmup_s
        end = start + seconds

        async def worker(stream: Iterator[BenchRequest]) -> None:
            while time.perf_counter() < end:
                request = next(stream)
                began = time.perf_counter()
                ok = False
                try:
                    response = await client.post(
                        request.route, content=request.body, headers=headers
                    )
                    ok = response.status_code == 200
                    if not ok and len(errors) < MAX_ERROR_SAMPLES:
                        errors.append(
                            f"{request.route}: HTTP {response.status_code} {response.text[:160]}"
                        )
                except httpx.HTTPError as err:
                    if len(errors) < MAX_ERROR_SAMPLES:
                        errors.append(f"{request.route}: {err!r}"[:200])
                if began >= start:
                    records.append(Record(request.route, began, time.perf_counter(), ok))

        await asyncio.gather(*(worker(stream) for stream in streams))
    summary = summarize(records, end, seconds)
    summary["error_samples"] = errors
    return summary


def closed_loop(
    url: str,
    mix: RequestMix,
    concurrency: int,
    *,
    warmup_s: float,
    seconds: float,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Run the closed loop against ``url`` (``/embed`` and ``/vision``) and summarize it."""
    return asyncio.run(_closed_loop(url, [(mix, concurrency)], warmup_s, seconds, timeout_s))


def closed_loop_groups(
    url: str,
    groups: Sequence[tuple[RequestMix, int]],
    *,
    warmup_s: float,
    seconds: float,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Several client groups at once, each ``(mix, clients)``: e.g. many clients saturating
    the heavy route while one probes the light one."""
    return asyncio.run(_closed_loop(url, groups, warmup_s, seconds, timeout_s))


def inprocess_loop(
    handle: Callable[[str, dict[str, Any]], Any],
    mix: RequestMix,
    *,
    warmup_s: float,
    seconds: float,
) -> dict[str, Any]:
    """One request at a time through ``handle(route, payload)``: no HTTP, no JSON."""
    stream = mix.stream(0)
    records: list[Record] = []
    start = time.perf_counter() + warmup_s
    end = start + seconds
    while time.perf_counter() < end:
        request = next(stream)
        began = time.perf_counter()
        try:
            handle(request.route, request.payload)
            ok = True
        except Exception:
            ok = False
        if began >= start:
            records.append(Record(request.route, began, time.perf_counter(), ok))
    return summarize(records, end, seconds)


def median_point(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median throughput (its latencies and routes as measured; of an even
    count, the lower of the middle two), with every round's req/s beside it."""
    ordered = sorted(rounds, key=lambda point: point["req_s"])
    point = dict(ordered[(len(ordered) - 1) // 2])
    point["rounds_req_s"] = [r["req_s"] for r in rounds]
    return point
