"""The Ray execution mode's per-request overhead against the single-process engine.

Same policy, same models, same device kind (ONNX Runtime on the CPU), c=1, requests of the two
engines interleaved in one run so machine noise hits both alike. Two workloads: the shipped
sentence embedder (one stage: one lane-actor call per request) and a two-stage bare-graph route
whose first stage's output (128 KiB) goes to the next stage's lane through the object store.
Prints p50 and p90 per engine, the difference and the ratio. Run with the Ray venv:
``make bench-ray`` (one local Ray node on loopback, started and shut down here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hetero.framework.engine import Engine
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import default_registry

DEVICE = "npu:onnxruntime/CPUExecutionProvider"
POLICY = """\
version: 1
devices: {{allow: [npu]}}
{cluster}
server: {{runtimes: {{text_embed: onnxruntime, encode: onnxruntime, head: onnxruntime}}}}
stages:
  text_embed:
    modality: text
    model_version: all-minilm-l6-v2@1
    variants: {{full: {{max_batch: 32, max_delay_ms: 0}}}}
  encode:
    modality: text
    variants: {{full: {{flops_per_item: 1 MFLOPS, bytes_per_item: 1 MB, max_batch: 1}}}}
  head:
    modality: embedding
    variants: {{full: {{flops_per_item: 1 MFLOPS, bytes_per_item: 1 MB, max_batch: 1}}}}
pipelines:
  two: {{steps: [{{stage: encode}}, {{stage: head}}]}}
routes: {{/two: two, /v1/embeddings: text_embed}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t}}}}
sla_tiers: {{t: {{deadline_ms: 60000}}}}
cache: {{enabled: false}}
"""
WIDE = 16_384


def matmul(name: str, weight: np.ndarray, src: str, dst: str) -> ComputeGraph:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", [src, "w"], [dst])],
        name,
        [helper.make_tensor_value_info(src, TensorProto.FLOAT, ["N", weight.shape[0]])],
        [helper.make_tensor_value_info(dst, TensorProto.FLOAT, ["N", weight.shape[1]])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    hint = BandwidthHint(flops_per_item=2 * weight.size, bytes_per_item=4 * weight.size)
    return ComputeGraph(name, GraphFormat.ONNX, model.SerializeToString(), hint, input_names=(src,))


def engine_for(cluster: str) -> Engine:
    from hetero.models.embed import TextEmbedder

    rng = np.random.default_rng(0)
    graphs = {
        "encode/full": matmul("encode", rng.standard_normal((16, WIDE), np.float32), "x", "h"),
        "head/full": matmul("head", rng.standard_normal((WIDE, 4), np.float32), "h", "y"),
    }
    policy = load_policy_text(POLICY.format(cluster=cluster), "overhead.yaml")
    engine = Engine(
        policy,
        default_registry(),
        graphs,
        plugins={"text_embed": TextEmbedder(runtime="onnxruntime")},
        pinned=dict(policy.spec.server.runtimes),
        probe=False,
    )
    engine.start()
    failed = engine.warm_up()
    if failed:
        raise SystemExit(f"warm-up failed: {failed}")
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="per engine and workload")
    args = parser.parse_args()

    import ray

    ray.init(
        num_cpus=1,
        resources={f"hetero/{DEVICE}": 1},
        object_store_memory=100 * 2**20,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        embedded = engine_for("")
        on_ray = engine_for("cluster: {engine: ray, address: auto}")
        x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
        workloads: dict[str, Callable[[Engine], Any]] = {
            "embed (1 stage)": lambda e: e.submit_stage("text_embed", ["a cat sat on the mat"]),
            "two stages, 128 KiB between": lambda e: e.submit("/two", {"x": x}),
        }
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(
            f"ray {ray.__version__}; c=1, {args.requests} requests per engine, interleaved;"
            f" load average {load}"
        )
        print(
            f"{'workload':<30}{'embedded p50':>14}{'ray p50':>10}{'+p50':>10}{'ratio':>7}"
            f"{'embedded p90':>14}{'ray p90':>10}"
        )
        for name, call in workloads.items():
            samples: dict[str, list[float]] = {"embedded": [], "ray": []}
            for _ in range(10):  # lanes, sessions and the object store warm up first
                call(embedded).result()
                call(on_ray).result()
            for _ in range(args.requests):
                for label, engine in (("embedded", embedded), ("ray", on_ray)):
                    began = time.perf_counter()
                    call(engine).result()
                    samples[label].append(time.perf_counter() - began)
            p50 = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
            p90 = {k: float(np.percentile(v, 90)) * 1e3 for k, v in samples.items()}
            print(
                f"{name:<30}{p50['embedded']:>11.2f} ms{p50['ray']:>7.2f} ms"
                f"{p50['ray'] - p50['embedded']:>+7.2f} ms{p50['ray'] / p50['embedded']:>7.2f}"
                f"{p90['embedded']:>11.2f} ms{p90['ray']:>7.2f} ms"
            )
        print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        embedded.close()
        on_ray.close()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
