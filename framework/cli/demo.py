"""``hetero demo``: serve a policy in-process on a free port, send a short mixed workload through
the HTTP API (photos, rendered text pages, speech made by the tts stage, questions) and print
what ran where."""

from __future__ import annotations

import base64
import socket
import statistics
import threading
import time
from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from hetero.framework.policy import load_policy
from hetero.framework.registry import Registry

__all__ = ["run_demo"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _workload(model: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
    from hetero.framework.samples import photo_png, text_page_png

    jobs: list[tuple[str, str, dict[str, Any]]] = []
    pages = [["OPEN 9 TO 5", "MONDAY TO FRIDAY"], ["INVOICE 1042", "TOTAL 18.50 EUR"]]
    for index, lines in enumerate(pages * 2):  # each page twice: the second is a cache hit
        url = "data:image/png;base64," + base64.b64encode(text_page_png(lines)).decode()
        jobs.append(
            (
                "chat+image",
                "/v1/chat/completions",
                {
                    "json": {
                        "model": model["llm_generate"],
                        "max_tokens": 24,
                        "messages": [
                            {
                                "role": "user",
                                "content": [
                                    {"type": "text", "text": "What does this page say?"},
                                    {"type": "image_url", "image_url": {"url": url}},
                                ],
                            }
                        ],
                    }
                },
            )
        )
        del index
    for seed in (1, 2, 1):
        jobs.append(
            (
                "describe",
                "/v1/image/describe",
                {"json": {"image": base64.b64encode(photo_png(seed)).decode(), "max_tokens": 20}},
            )
        )
    for question in ("What is the capital of France?", "Give me two uses for a brick."):
        jobs.append(
            (
                "chat",
                "/v1/chat/completions",
                {
                    "json": {
                        "model": model["llm_generate"],
                        "max_tokens": 24,
                        "messages": [{"role": "user", "content": question}],
                    }
                },
            )
        )
    sentences = ["A man is eating food.", "Someone is having a meal.", "The train is late."]
    for _ in range(6):
        jobs.append(
            (
                "embeddings",
                "/v1/embeddings",
                {"json": {"model": model["text_embed"], "input": sentences}},
            )
        )
    return jobs


def run_demo(out: Console, err: Console, registry: Registry, policy_path: str) -> int:
    """Serve, send the workload, print the table."""
    import httpx
    import uvicorn

    from hetero.framework.cli.startup import compliance_for, load_with_progress
    from hetero.framework.server import Serving, create_app

    policy = load_policy(policy_path)
    gate, sandboxes = compliance_for(policy)
    runtime = Serving(policy, registry=registry, gate=gate, sandboxes=sandboxes)
    load_with_progress(runtime, err)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(runtime, registry=registry), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    latencies: dict[str, list[float]] = defaultdict(list)
    failures: list[str] = []
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            while True:
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            models = {s.kind: runtime.model_id(s) for s in runtime.stages.values()}
            speech_text = "Please schedule the meeting for Tuesday afternoon."
            if "tts" in models and "asr" in models:
                spoken = client.post(
                    "/v1/audio/speech",
                    json={"model": models["tts"], "input": speech_text, "response_format": "wav"},
                )
                for _ in range(2):
                    began = time.perf_counter()
                    heard = client.post(
                        "/v1/audio/transcriptions",
                        files={"file": ("speech.wav", spoken.content)},
                        data={"model": models["asr"]},
                    )
                    latencies["transcription"].append(time.perf_counter() - began)
                err.print(
                    f"tts -> asr: {speech_text!r} -> {heard.json().get('text')!r}", highlight=False
                )
            for label, route, request in _workload(models):
                began = time.perf_counter()
                response = client.post(route, **request)
                latencies[label].append(time.perf_counter() - began)
                if response.status_code >= 400:
                    failures.append(f"{label}: {response.status_code} {response.text[:200]}")
    finally:
        server.should_exit = True
        thread.join(10)
    _print_tables(out, runtime, latencies)
    runtime.close()
    for failure in failures:
        err.print(f"[red]failed[/]: {failure}", highlight=False)
    return 1 if failures else 0


def _ms_pair(p50: float | None, p99: float | None) -> str:
    if p50 is None or p99 is None:
        return "-"
    return f"{p50 * 1000:.0f} / {p99 * 1000:.0f} ms"


def _print_tables(out: Console, runtime: Any, latencies: dict[str, list[float]]) -> None:
    hits: dict[str, float] = {}
    for family in runtime.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "hetero_cache_hits_total":
                hits[sample.labels["stage"]] = sample.value
    table = Table(title="Stages", title_justify="left")
    for column in (
        "stage",
        "model",
        "placed on (requests)",
        "warm-up timing per device",
        "batches",
        "per item p50 / p99",
        "cache hits",
        "light variant",
        "sandboxed",
    ):
        table.add_column(column)
    for row in runtime.describe():
        timings = ", ".join(
            f"{name} {value * 1000:.0f} ms" if isinstance(value, float) else f"{name} n/a"
            for name, value in row["warmup_timings_s"].items()
        )
        placed = ", ".join(f"{device} ({count})" for device, count in row["placements"].items())
        table.add_row(
            row["stage"],
            row["model"],
            placed or row["resident_on"],
            timings or "one device",
            str(row["batches"]),
            _ms_pair(row["item_p50_s"], row["item_p99_s"]),
            str(int(hits.get(row["stage"], 0))),
            str(row["light_runs"]),
            row["partition"] or "-",
        )
    for name, failure in runtime.failed.items():  # skipped: the reason stands in the row
        table.add_row(name, "-", f"[red]not served[/]: {failure.reason}", *["-"] * 6)
    out.print(table)
    routes = Table(title="Requests (client-side latency)", title_justify="left")
    for column in ("request", "count", "p50", "p99"):
        routes.add_column(column)
    for label, values in latencies.items():
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        routes.add_row(
            label,
            str(len(values)),
            f"{statistics.median(values) * 1000:.0f} ms",
            f"{p99 * 1000:.0f} ms",
        )
    out.print(routes)
