"""``hetero bench serve``'s parts on a tiny fake app: the load generator's report, the request
mix (unique or repeated content), the ratios. No timing is asserted."""

from __future__ import annotations

import io
import itertools
from typing import Any

from conftest import ServerThread
from fastapi import FastAPI

from hetero.framework.bench.serve import ratios
from hetero.framework.bench.serve_load import closed_loop, inprocess_loop
from hetero.framework.bench.serve_mix import RequestMix, base_images, unique_image


def fake_app() -> FastAPI:
    app = FastAPI()

    @app.post("/embed")
    def embed(body: dict[str, Any]) -> dict[str, Any]:
        return {"embeddings": [[0.0] * 384 for _ in body["texts"]]}

    @app.post("/vision")
    def vision(body: dict[str, Any]) -> dict[str, Any]:
        return {"embedding": [0.0] * 1280, "top1": 0}

    return app


def check_point(point: dict[str, Any]) -> None:
    assert {"requests", "errors", "req_s", "p50_ms", "p99_ms", "routes"} <= set(point)
    assert set(point["routes"]) == {"embed", "vision"}
    assert point["requests"] > 0
    assert point["errors"] == 0
    for figures in point["routes"].values():
        assert {"requests", "errors", "req_s", "p50_ms", "p99_ms"} == set(figures)


def test_closed_loop_reports_overall_and_per_route() -> None:
    with ServerThread(fake_app()) as server:
        point = closed_loop(server.url, RequestMix("t1"), 2, warmup_s=0.1, seconds=0.5)
    check_point(point)
    assert point["error_samples"] == []


def test_inprocess_loop_reports_the_same_shape() -> None:
    point = inprocess_loop(lambda route, payload: None, RequestMix("t2"), warmup_s=0, seconds=0.2)
    check_point(point)


def test_content_is_unique_unless_repeated() -> None:
    from PIL import Image

    cold = list(itertools.islice(RequestMix("t3").stream(0), 300))
    assert len({r.body for r in cold}) == len(cold)
    assert {r.route for r in cold} == {"/embed", "/vision"}
    warm = list(itertools.islice(RequestMix("t3", repeat_share=0.3).stream(0), 300))
    repeated = [r for r in warm if r.repeated]
    assert 30 < len(repeated) < 150
    assert all(r.body in {w.body for w in warm if not w.repeated} for r in repeated)
    for image in base_images():
        tagged = unique_image(image, "t3-0-1")
        assert tagged != image
        with Image.open(io.BytesIO(tagged)) as decoded:
            decoded.load()
        with Image.open(io.BytesIO(image)) as original:
            assert decoded.tobytes() == original.tobytes()


def test_ratios_name_every_goal() -> None:
    def point(req_s: float, p99: float) -> dict[str, Any]:
        route = {"req_s": req_s / 2, "p50_ms": p99 / 2, "p99_ms": p99}
        return {"req_s": req_s, "p99_ms": p99, "routes": {"embed": route, "vision": route}}

    def stack(req_s: float, loaded_p99: float) -> dict[str, Any]:
        points = {"1": point(req_s, 20.0), "8": point(req_s, 100.0), "32": point(req_s, 400.0)}
        isolation = {
            "heavy_clients": 32,
            "embed_alone": {"req_s": 50.0, "p50_ms": 10.0, "p99_ms": 20.0},
            "embed_under_load": {"req_s": 30.0, "p50_ms": 20.0, "p99_ms": loaded_p99},
            "vision_under_load": {"req_s": 40.0, "p50_ms": 300.0, "p99_ms": 500.0},
        }
        return {
            "points": points,
            "repeated": points,
            "isolation": isolation,
            "idle_rss_mb": 300.0,
            "startup_s": 1.5,
        }

    stacks = {
        "hetero": stack(120.0, 50.0),
        "fastapi": stack(100.0, 400.0),
        "hetero_cache": stack(160.0, 50.0),
        "hetero_free": stack(130.0, 50.0),
    }
    out, goals = ratios(stacks, [1, 8, 32])
    assert out["c8_throughput_hetero_vs_fastapi"] == 1.2
    assert out["c8_repeated_hetero_vs_fastapi"] == 1.6
    assert out["c8_free_placement_vs_fastapi"] == 1.3
    assert out["hetero_embed_p99_c32_vs_c1"] == 20.0
    assert out["hetero_light_p99_under_heavy_vs_alone"] == 2.5
    assert out["fastapi_light_p99_under_heavy_vs_alone"] == 20.0
    assert goals["c8 throughput >= 1.05x FastAPI"]["met"] is True
    assert goals["c1 throughput >= FastAPI"]["met"] is True
    assert goals["c32 throughput >= 1.1x FastAPI"]["met"] is True
    assert out["c8_repeated_cache_on_vs_off"] == round(160.0 / 120.0, 2)
    assert goals["30% repeated, c8 throughput, cache on vs off"]["met"] is False  # 1.33x
    assert goals["30% repeated, c8 p99, cache on vs off"]["met"] is True
    assert goals["free placement, c8 throughput vs FastAPI on ONNX Runtime"]["met"] is True
    light = "light (embed) p99 with 32 clients saturating vision / alone"
    assert goals[light]["met"] is True
    assert goals["start-up s"]["met"] is True


def test_every_run_sends_the_same_shapes_with_its_own_content() -> None:
    first = list(itertools.islice(RequestMix("r1", repeat_share=0.3).stream(0), 200))
    second = list(itertools.islice(RequestMix("r2", repeat_share=0.3).stream(0), 200))

    def shape(request: Any) -> tuple[Any, ...]:
        texts = request.payload.get("texts")
        return (request.route, request.repeated, None if texts is None else len(texts))

    assert [shape(r) for r in first] == [shape(r) for r in second]
    fresh = [(a, b) for a, b in zip(first, second, strict=True) if not a.repeated]
    assert fresh and all(a.body != b.body for a, b in fresh)  # no run hits another's cache
    other_worker = list(itertools.islice(RequestMix("r1", repeat_share=0.3).stream(1), 200))
    assert [r.route for r in other_worker] != [r.route for r in first]  # the control
