"""A chat completion with an image, end to end at concurrency 1: hetero's one request graph
(vision and OCR of the image together, then the LLM) against the same stages run one after
another in the same process (vision, then OCR, then the LLM, each waited for), on the shipped
models (EfficientNet-Lite0, PP-OCRv4, SmolLM2) and this host's devices, feature cache off.

The two are interleaved request by request, so machine noise hits both; the figure is the
ratio of their p50 (goal <= 0.8: the overlap of vision and OCR has to show). Run:
``.venv/bin/python benchmarks/chat_image_overlap.py [requests]``.
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import sys
import time
from typing import Any

import httpx
import yaml

from hetero.framework.policy import builtin_policy_text, load_policy_text
from hetero.framework.samples import text_page_png
from hetero.framework.scheduler.breakers import RequestProfile
from hetero.framework.server import Serving, create_app
from hetero.framework.server.auth import ANONYMOUS, Caller
from hetero.framework.server.media import image_size
from hetero.framework.server.pipelines import SYSTEM_PROMPT, image_context

MAX_TOKENS = 8
STAGES = ("vision_encode", "ocr", "llm_generate")


def _runtime() -> Serving:
    policy = yaml.safe_load(builtin_policy_text("default"))
    policy["stages"] = {k: v for k, v in policy["stages"].items() if k in STAGES}
    policy["routes"] = {r: t for r, t in policy["routes"].items() if t in STAGES}
    policy["devices"]["deny"] = ["dummy"]
    text = yaml.safe_dump(policy, sort_keys=False)
    return Serving(load_policy_text(text, "chat-image-bench"), use_cache=False)


def _body(image: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    return {
        "model": "smollm2-135m-instruct",
        "max_tokens": MAX_TOKENS,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What does the sign say?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
    }


async def _one_after_another(
    rt: Serving, image: bytes, caller: Caller, times: dict[str, list[float]]
) -> None:
    """The same stages, each waited for before the next starts (each one's time noted)."""
    width, height = image_size(image, rt.limits, "image")
    profile = RequestProfile.of_image(width, height)
    began = time.perf_counter()
    vision, _ = await rt.calls.run(
        rt.stage_of_kind("vision_encode"), image, caller=caller, profile=profile
    )
    times["vision_encode"].append(time.perf_counter() - began)
    began = time.perf_counter()
    ocr, _ = await rt.calls.run(rt.stage_of_kind("ocr"), image, caller=caller, profile=profile)
    times["ocr"].append(time.perf_counter() - began)
    began = time.perf_counter()
    context = image_context(vision["labels"], ocr["text"])
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"What does the sign say?\n{context}"},
    ]
    pieces, summary, _ = await rt.calls.generate(messages, caller=caller, max_tokens=MAX_TOKENS)
    async for _ in pieces:
        pass
    await summary
    times["llm_generate"].append(time.perf_counter() - began)


async def _measure(requests: int) -> dict[str, Any]:
    rt = _runtime()
    await asyncio.to_thread(rt.start)
    app = create_app(rt)
    caller = Caller(ANONYMOUS, "standard", "silver", anonymous=True)
    graph: list[float] = []
    sequential: list[float] = []
    times: dict[str, list[float]] = {stage: [] for stage in STAGES}
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            for index in range(requests + 2):  # the first two warm both paths up
                image = text_page_png([f"SIGN {index}"])
                began = time.perf_counter()
                answer = await client.post("/v1/chat/completions", json=_body(image))
                took = time.perf_counter() - began
                answer.raise_for_status()
                began = time.perf_counter()
                await _one_after_another(rt, text_page_png([f"PLATE {index}"]), caller, times)
                if index >= 2:
                    graph.append(took)
                    sequential.append(time.perf_counter() - began)
    finally:
        rt.close()
    p50_graph, p50_sequential = statistics.median(graph), statistics.median(sequential)
    return {
        "requests": requests,
        "graph_p50_ms": round(p50_graph * 1e3, 1),
        "one_after_another_p50_ms": round(p50_sequential * 1e3, 1),
        "ratio": round(p50_graph / p50_sequential, 3),
        "goal": "<= 0.8",
        "one_after_another_stage_p50_ms": {
            stage: round(statistics.median(t[2:]) * 1e3, 1) for stage, t in times.items()
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    """Print the figures."""
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    result = asyncio.run(_measure(requests))
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
