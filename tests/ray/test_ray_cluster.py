"""The engine on a real Ray cluster on loopback (``ray.cluster_utils.Cluster``, one for the
module: a head lending its OpenVINO CPU device, a worker lending its ONNX Runtime one through a
custom resource each, so the fleet is heterogeneous), real ONNX graphs and shipped models run by
device actors on the nodes. Run by ``make test-ray`` in its own venv; the tests run in file order
(the last one removes and adds nodes)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, wait
from typing import Any

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster

from hetero.framework.cluster.lane_actor import RayOutput, RayOutputs
from hetero.framework.cluster.ray_cluster import RAY_BACKEND, connect, disconnect
from hetero.framework.cluster.remote_lanes import ACTOR_NICENESS
from hetero.framework.engine import Engine
from hetero.framework.engine.graph_stage import GraphStage
from hetero.framework.errors import DeviceUnhealthyError, InputLostError
from hetero.framework.fleet import resolve_fleet
from hetero.framework.graph import GraphFormat
from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.registry import default_registry
from hetero.framework.remote import RemoteValue

OBJECT_STORE = 80 * 2**20
OPENVINO = "npu:openvino/CPU"
ONNXRUNTIME = "npu:onnxruntime/CPUExecutionProvider"
TORCH = "npu:torch/cpu"


def node_args(*devices: str) -> dict[str, object]:
    """A node that lends hetero these devices."""
    return {
        "num_cpus": 1,
        "object_store_memory": OBJECT_STORE,
        "resources": {f"hetero/{device}": 1 for device in devices},
        "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """The head (OpenVINO, and torch for the LLM) and one worker (ONNX Runtime); tests may
    remove and add nodes."""
    cluster = Cluster(initialize_head=True, head_node_args=node_args(OPENVINO, TORCH))
    cluster.add_node(**node_args(ONNXRUNTIME))
    cluster.wait_for_nodes()
    yield cluster
    disconnect()
    ray.shutdown()
    cluster.shutdown()


RNG = np.random.default_rng(5)
WIDE = 16_384  # encode's output row: 64 KiB, so a batch's outputs go to the object store
W1 = RNG.standard_normal((16, WIDE)).astype(np.float32)
W2 = (RNG.standard_normal((WIDE, 4)) / np.sqrt(WIDE)).astype(np.float32)

POLICY = """\
version: 1
devices: {{allow: [npu]}}
cluster: {{engine: ray, address: "{address}", heartbeat_s: 0.5}}
stages:
  encode:
    modality: text
    variants:
      full: {{flops_per_item: 1 MFLOPS, bytes_per_item: 10 kB, resident_bytes: 1 MB,
             max_batch: 8, max_delay_ms: 1}}
  head:
    modality: embedding
    variants:
      full: {{flops_per_item: 1 MFLOPS, bytes_per_item: 10 kB, resident_bytes: 1 MB,
             max_batch: 8, max_delay_ms: 1}}
pipelines:
  two: {{steps: [{{stage: encode}}, {{stage: head}}]}}
routes: {{/two: two}}
scheduler: {{placement: round_robin}}
circuit_breaker:
  device: {{window: 4, min_calls: 2, error_rate: 0.5, open_s: 60}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t, queue_bound: 1024}}}}
sla_tiers: {{t: {{deadline_ms: 120000}}}}
"""


def matmul_graph(name: str, weight: np.ndarray, src: str, dst: str, relu: bool) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    from hetero.framework.graph import BandwidthHint, ComputeGraph

    nodes = [helper.make_node("MatMul", [src, "w"], ["mm" if relu else dst])]
    if relu:
        nodes.append(helper.make_node("Relu", ["mm"], [dst]))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(src, TensorProto.FLOAT, ["N", weight.shape[0]])],
        [helper.make_tensor_value_info(dst, TensorProto.FLOAT, ["N", weight.shape[1]])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    hint = BandwidthHint(flops_per_item=2 * weight.size, bytes_per_item=4 * weight.size)
    return ComputeGraph(name, GraphFormat.ONNX, model.SerializeToString(), hint, input_names=(src,))


GRAPHS = {
    "encode/full": matmul_graph("encode", W1, "x", "h", relu=True),
    "head/full": matmul_graph("head", W2, "h", "y", relu=False),
}


def expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W1, 0) @ W2


def policy_for(cluster: Cluster) -> Policy:
    return load_policy_text(POLICY.format(address=cluster.address), "cluster.yaml")


def node_of(device_id: str) -> str:
    return device_id.rsplit("@", 1)[1]


def short(node_id: str) -> str:
    return f"node-{node_id[:8]}"


def submit_all(engine: Engine, count: int) -> list[tuple[np.ndarray, Future[Any]]]:
    inputs = [RNG.standard_normal((2, 16)).astype(np.float32) for _ in range(count)]
    return [(x, engine.submit("/two", {"x": x})) for x in inputs]


def settle(submitted: list[tuple[np.ndarray, Future[Any]]]) -> list[Any]:
    """Every request's result, each checked against numpy (none may be lost)."""
    wait([future for _, future in submitted])
    results = [future.result() for _, future in submitted]
    for (x, _), result in zip(submitted, results, strict=True):
        np.testing.assert_allclose(result.outputs["head"]["y"], expected(x), rtol=1e-3, atol=1e-3)
    return results


def test_hetero_devices_lists_every_node_of_the_cluster(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    policy = tmp_path / "cluster.yaml"
    policy.write_text(POLICY.format(address=cluster.address))
    hetero = pathlib.Path(sys.executable).with_name("hetero")
    result = subprocess.run(
        [str(hetero), "devices", "--policy", str(policy), "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    devices = json.loads(result.stdout)["devices"]
    by_node: dict[str, set[str]] = {}
    for d in devices:
        by_node.setdefault(d["properties"]["node_id"], set()).add(d["properties"]["node_device"])
    # Each node lends only the devices it advertises a hetero/<device> resource for.
    assert by_node == {
        str(cluster.head_node.node_id): {OPENVINO, TORCH},
        str(next(iter(cluster.worker_nodes)).node_id): {ONNXRUNTIME},
    }


def test_lanes_are_actors_on_their_nodes_and_outputs_move_through_the_object_store(
    cluster: Cluster,
) -> None:
    policy = policy_for(cluster)
    registry = default_registry()
    fleet = resolve_fleet(policy, registry)
    assert {d.backend for d in fleet.devices} == {RAY_BACKEND}
    assert {d.host for d in fleet.devices} == {node_of(d.id) for d in fleet.devices}
    head = short(str(cluster.head_node.node_id))
    worker = short(str(next(iter(cluster.worker_nodes)).node_id))
    on_head = f"{OPENVINO}@{head}"
    on_worker = f"{ONNXRUNTIME}@{worker}"
    assert {d.id for d in fleet.devices} == {on_head, on_worker, f"{TORCH}@{head}"}
    before = ray.available_resources()
    pinned = {"encode": "onnxruntime", "head": "openvino"}  # encode on the worker, head here
    with Engine(policy, registry, GRAPHS, pinned=pinned) as engine:
        results = settle(submit_all(engine, 12))
        assert {(r.devices["encode"], r.devices["head"]) for r in results} == {(on_worker, on_head)}
        # One actor per device that ran, each holding 0.01 of its device.
        after = ray.available_resources()
        for device in (OPENVINO, ONNXRUNTIME):
            name = f"hetero/{device}"
            assert before[name] - after[name] == pytest.approx(0.01)
        worker_host, head_host = engine.models[on_worker], engine.models[on_head]
        assert worker_host.resident("encode/full") and not worker_host.resident("head/full")
        assert head_host.resident("head/full")

        # A stage's large outputs stay in its device's actor; the next stage on that device
        # reads them in place, one on another node gets them from that actor (one call, Ray
        # moves them between the nodes); the front door never holds them. Small ones come
        # back with the answer.
        x = RNG.standard_normal((2, 16)).astype(np.float32)
        fmt = GraphFormat.ONNX
        made = worker_host.run_batch(engine.plugins["encode"], "encode/full", fmt, 0, [{"x": x}])
        (outputs,) = made.results
        assert isinstance(outputs, RayOutputs) and isinstance(outputs["h"], RayOutput)
        assert outputs["h"].shape == (2, WIDE) and outputs["h"].nbytes == 2 * WIDE * 4
        worker_actor = worker_host.actor
        assert ray.get(worker_actor.niceness.remote()) == ACTOR_NICENESS  # not Ray's 15

        def kept() -> dict[str, int]:
            return dict(ray.get(worker_actor.kept_stats.remote()))

        served = kept()["served"]
        plugin = engine.plugins["head"]
        same = worker_host.run_batch(plugin, "head/full", fmt, 0, [{"h": outputs["h"]}])
        assert kept()["served"] == served  # read where it lay, not copied out
        other = head_host.run_batch(plugin, "head/full", fmt, 0, [{"h": outputs["h"]}])
        assert kept()["served"] == served + 1  # the head's actor asked the worker's for it
        for ran in (same, other):
            (y,) = ran.results
            assert not isinstance(y, RemoteValue)  # 32 bytes: answered inline
            np.testing.assert_allclose(y["y"], expected(x), rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(outputs["h"].fetch(), np.maximum(x @ W1, 0), rtol=1e-4)
        held = kept()["batches"]
        del outputs, made  # the front door's last stand-ins of that batch: it is released
        assert until(lambda: kept()["batches"] == held - 1)

        assert worker_host.stages == {"encode", "head"} and head_host.stages == {"head"}
        lanes = [worker_actor, head_host.actor]
    for lane in lanes:  # closing the engine ended its actors (ray.kill is asynchronous)
        assert until(lambda lane=lane: lane_is_dead(lane))


def test_in_a_batch_only_the_item_whose_kept_input_was_dropped_is_lost(cluster: Cluster) -> None:
    """A batch on the head reads two batches kept on the worker, one of them dropped there:
    that item alone is answered InputLostError (its producer runs again), the other one runs;
    the control: both kept, both run."""
    policy = policy_for(cluster)
    worker = short(str(next(iter(cluster.worker_nodes)).node_id))
    head = short(str(cluster.head_node.node_id))
    on_worker, on_head = f"{ONNXRUNTIME}@{worker}", f"{OPENVINO}@{head}"
    pinned = {"encode": "onnxruntime", "head": "openvino"}
    with Engine(policy, default_registry(), GRAPHS, pinned=pinned) as engine:
        settle(submit_all(engine, 2))  # both stages taken in by their actors
        worker_host, head_host = engine.models[on_worker], engine.models[on_head]
        encode, head_stage, fmt = engine.plugins["encode"], engine.plugins["head"], GraphFormat.ONNX
        xs = [RNG.standard_normal((2, 16)).astype(np.float32) for _ in range(2)]
        kept = [
            worker_host.run_batch(encode, "encode/full", fmt, 0, [{"x": x}]).results[0]["h"]
            for x in xs
        ]
        payloads = [{"h": h} for h in kept]
        both = head_host.run_batch(head_stage, "head/full", fmt, 0, payloads).results
        for x, y in zip(xs, both, strict=True):  # the control
            np.testing.assert_allclose(y["y"], expected(x), rtol=1e-3, atol=1e-3)
        ray.get(worker_host.actor.release.remote(kept[0].batch.batch_id))
        lost, ran = head_host.run_batch(head_stage, "head/full", fmt, 0, payloads).results
        assert isinstance(lost, InputLostError) and lost.devices == (on_worker,)
        np.testing.assert_allclose(ran["y"], expected(xs[1]), rtol=1e-3, atol=1e-3)


def test_each_nodes_device_telemetry_is_read_on_its_node(cluster: Cluster) -> None:
    """Read by the node's agent with the device's own backend, named by its fleet id."""
    backend = connect(policy_for(cluster).spec.cluster).backend
    for device in backend.devices():
        sample = backend.telemetry(device.id)
        assert sample.device_id == device.id
        assert 0 < sample.memory_used_bytes <= device.memory_bytes
        assert 0.0 <= sample.utilisation <= 1.0


def lane_is_dead(lane: Any) -> bool:
    """Whether a call to ``lane`` fails because the actor is gone."""
    try:
        ray.get(lane.ready.remote(), timeout=120)
    except ray.exceptions.RayActorError:
        return True
    return False


DEFAULT_POLICY = pathlib.Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
# Every stage of the default policy pinned to one node's runtime, so its routes cross nodes:
# the head lends OpenVINO and torch, the worker ONNX Runtime.
RUNTIMES = {
    "vision_encode": "openvino",  # head
    "asr": "openvino",  # head (Whisper's KV-cache loop in the device actor)
    "llm_generate": "torch",  # head
    "text_embed": "onnxruntime",  # worker
    "ocr": "onnxruntime",  # worker
    "tts": "onnxruntime",  # worker
}


def served_policy(address: str) -> str:
    """The shipped default policy (its stages, pipelines and routes, unchanged) on the cluster,
    each stage pinned to one node's runtime by :data:`RUNTIMES`, without the feature cache."""
    import yaml

    spec = yaml.safe_load(DEFAULT_POLICY.read_text())
    assert set(spec["stages"]) == set(RUNTIMES), "a stage of the default policy is not placed"
    spec["name"] = "default-on-ray"
    spec["devices"] = {"allow": ["npu"]}
    spec["cluster"] = {"engine": "ray", "address": address}
    spec.setdefault("server", {})["runtimes"] = RUNTIMES
    spec["cache"] = {"enabled": False}
    return str(yaml.safe_dump(spec, sort_keys=False))


def test_hetero_serve_answers_the_default_policys_routes_on_devices_of_both_nodes(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    import base64
    import signal

    import httpx

    from hetero.framework.samples import photo_png

    policy = tmp_path / "served.yaml"
    policy.write_text(served_policy(cluster.address))
    connect(policy_for(cluster).spec.cluster)  # this process on the cluster, to read its state
    earlier = {a["ActorID"] for a in other_jobs_actors()}

    def served_actors() -> list[dict[str, Any]]:
        return [a for a in other_jobs_actors() if a["ActorID"] not in earlier]

    hetero = pathlib.Path(sys.executable).with_name("hetero")
    serve = subprocess.Popen(
        [str(hetero), "serve", "--port", "0", "--policy", str(policy)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    head = short(str(cluster.head_node.node_id))
    worker = short(str(next(iter(cluster.worker_nodes)).node_id))
    try:
        assert serve.stderr is not None
        url = ready_url(serve.stderr)
        embedded = httpx.post(
            f"{url}/v1/embeddings",
            json={"model": "all-minilm-l6-v2", "input": ["a cat sat", "on the mat"]},
            timeout=120,
        )
        assert embedded.status_code == 200, embedded.text
        vectors = [row["embedding"] for row in embedded.json()["data"]]
        assert len(vectors) == 2 and all(len(v) == 384 for v in vectors)
        assert abs(float(np.linalg.norm(vectors[0])) - 1.0) < 1e-3
        (ran,) = json.loads(embedded.headers["X-Hetero-Stages"])
        assert ran["device"] == f"{ONNXRUNTIME}@{worker}"  # the worker's device
        image = base64.b64encode(photo_png(seed=1)).decode()
        described = httpx.post(f"{url}/v1/image/describe", json={"image": image}, timeout=300)
        assert described.status_code == 200, described.text
        body = described.json()
        assert len(body["labels"]) == 5 and body["description"].strip(), body
        from hetero.models.vision import VisionEncoder

        (here,) = VisionEncoder(runtime="onnxruntime").encode([photo_png(seed=1)])
        assert here.labels[0][0] in json.dumps(body["labels"][0])  # the top label, as run here
        assert ran_on(body["hetero"]["stages"]) == {
            "vision_encode": f"{OPENVINO}@{head}",  # the head's devices
            "llm_generate": f"{TORCH}@{head}",
        }
        chat_streams_from_the_node_and_stops_when_the_client_leaves(url, served_actors(), head)
        image_question_runs_its_stages_on_both_nodes(url, head, worker)
        speech_on_the_worker_is_transcribed_on_the_head(url, head, worker)
        assert {
            ("text_embed", f"{ONNXRUNTIME}@{worker}"),
            ("ocr", f"{ONNXRUNTIME}@{worker}"),
            ("tts", f"{ONNXRUNTIME}@{worker}"),
            ("vision_encode", f"{OPENVINO}@{head}"),
            ("asr", f"{OPENVINO}@{head}"),
            ("llm_generate", f"{TORCH}@{head}"),
        } <= placements(url)
        # Control: while it serves, its node agents and lane actors are alive on the cluster.
        assert {"NodeAgent", "LaneActor"} <= {a["ActorClassName"] for a in served_actors()}
        # SIGTERM drains and exits 0, as on the embedded engine (ray.init's failure handler
        # would abort it with exit -6: framework/cluster/signals.py keeps the drain).
        serve.send_signal(signal.SIGTERM)
        rest = serve.stderr.read()
        assert serve.wait(timeout=120) == 0, rest
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert "Traceback" not in rest
    assert until(lambda: not served_actors()), served_actors()  # nothing of it is left


def ran_on(stages: list[dict[str, Any]]) -> dict[str, str]:
    """Stage -> device, from a response's ``X-Hetero-Stages`` / ``hetero.stages``."""
    return {run["stage"]: run["device"] for run in stages}


def image_question_runs_its_stages_on_both_nodes(url: str, head: str, worker: str) -> None:
    """The default policy's image_question pipeline (``/v1/image/question``) and a chat message
    with an image: vision on the head and OCR on the worker side by side, then the LLM on the
    head with what both saw."""
    import base64

    import httpx

    from hetero.framework.samples import text_page_png
    from hetero.models.ocr import TextReader

    sign = text_page_png(["HELLO WORLD", "OPEN 9 TO 5"])
    page = base64.b64encode(sign).decode()
    question = httpx.post(
        f"{url}/v1/image/question",
        json={"inputs": {"image": page}, "prompt": "What does the sign say?", "max_tokens": 16},
        timeout=300,
    )
    assert question.status_code == 200, question.text
    body = question.json()
    assert body["pipeline"] == "image_question"
    assert body["outputs"]["ocr"]["text"] == TextReader(runtime="onnxruntime").read(sign).text
    assert body["outputs"]["llm_generate"]["text"].strip()
    assert ran_on(body["hetero"]["stages"]) == {
        "vision_encode": f"{OPENVINO}@{head}",
        "ocr": f"{ONNXRUNTIME}@{worker}",
        "llm_generate": f"{TORCH}@{head}",
    }
    asked = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "model": "smollm2-135m-instruct",
            "max_tokens": 16,
            "temperature": 0,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What does the sign say?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{page}"},
                        },
                    ],
                }
            ],
        },
        timeout=300,
    )
    assert asked.status_code == 200, asked.text
    assert asked.json()["choices"][0]["message"]["content"].strip()
    assert asked.json()["usage"]["prompt_tokens"] > 10
    assert ran_on(json.loads(asked.headers["X-Hetero-Stages"])) == {
        "vision_encode": f"{OPENVINO}@{head}",
        "ocr": f"{ONNXRUNTIME}@{worker}",
        "llm_generate": f"{TORCH}@{head}",
    }


def speech_on_the_worker_is_transcribed_on_the_head(url: str, head: str, worker: str) -> None:
    """tts (Piper) on the worker's device, then the default policy's two ASR routes (Whisper's
    KV-cache loop in the head's device actor) hear what it said."""
    import base64

    import httpx
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    spoken = client.audio.speech.with_raw_response.create(
        model="piper-joe-medium",
        voice="joe",
        input="The weather is nice today.",
        response_format="wav",
    )
    assert ran_on(json.loads(spoken.headers["X-Hetero-Stages"])) == {
        "tts": f"{ONNXRUNTIME}@{worker}"
    }
    audio = spoken.content
    heard = client.audio.transcriptions.with_raw_response.create(
        model="whisper-tiny.en", file=("speech.wav", audio)
    )
    assert ran_on(json.loads(heard.headers["X-Hetero-Stages"])) == {"asr": f"{OPENVINO}@{head}"}
    text = heard.parse().text.lower()
    assert "weather" in text and "today" in text, text
    transcribed = httpx.post(
        f"{url}/v1/speech/transcribe",
        json={"audio": base64.b64encode(audio).decode()},
        timeout=300,
    )
    assert transcribed.status_code == 200, transcribed.text
    assert "weather" in transcribed.json()["text"].lower()
    assert ran_on(transcribed.json()["hetero"]["stages"]) == {"asr": f"{OPENVINO}@{head}"}


def chat_streams_from_the_node_and_stops_when_the_client_leaves(
    url: str, actors: list[dict[str, Any]], head: str
) -> None:
    """The LLM runs in the head's torch device actor: its pieces stream back through the front
    door to the ``openai`` SDK as they are made, and a client that leaves mid-stream stops the
    generation on the node (the actor's own count), not only the HTTP stream."""
    import openai

    from hetero.framework.cluster.lane_start import actor_name

    (name,) = [a["Name"] for a in actors if a["Name"] == actor_name(f"{TORCH}@{head}")]
    lanes = ray.get_actor(name, namespace="hetero")

    def streams() -> dict[str, int]:
        return dict(ray.get(lanes.stream_stats.remote()))

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    before = streams()
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct",
        max_tokens=24,
        temperature=0,
        stream=True,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    pieces = [
        c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) > 2 and "Paris" in "".join(pieces), pieces  # piece by piece, greedy
    assert streams()["started"] == before["started"] + 1  # generated in the node's actor

    story = [{"role": "user", "content": "Write a very long story about a dragon and a ship."}]
    long = client.chat.completions.create(
        model="smollm2-135m-instruct", max_tokens=512, temperature=0, stream=True, messages=story
    )
    got = 0
    for chunk in long:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got == 3:
            break
    assert streams()["running"] == 1  # still generating on the node
    long.close()  # the client leaves
    assert until(lambda: streams()["running"] == 0), streams()
    assert streams()["stopped"] == before["stopped"] + 1  # stopped there, not run to its end


def ready_url(stderr: Any) -> str:
    """``hetero serve``'s URL, once it says every model is loaded on the nodes."""
    import re

    url, seen = "", []
    for line in stderr:
        seen.append(line)
        found = re.search(r"listening on (http://\S+)", line)
        url = found.group(1) if found else url
        if line.startswith("ready"):
            break
    assert url and seen[-1].startswith("ready") and "not served" not in seen[-1], seen
    return url


def placements(url: str) -> set[tuple[str, str]]:
    """(stage, device) pairs ``hetero_placements_total`` counts at least once."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    metrics = httpx.get(f"{url}/metrics", timeout=60).text
    return {
        (sample.labels["stage"], sample.labels["device"])
        for family in text_string_to_metric_families(metrics)
        if family.name == "hetero_placements"
        for sample in family.samples
        if sample.name == "hetero_placements_total" and sample.value >= 1
    }


def other_jobs_actors() -> list[dict[str, Any]]:
    """Alive actors on the cluster that another driver (job) than this test process made."""
    mine = ray.get_runtime_context().get_job_id()
    return [
        actor
        for actor in ray._private.state.actors().values()
        if actor["State"] == "ALIVE" and actor["JobID"] != mine
    ]


def until(condition: Any, timeout_s: float = 60.0) -> bool:
    """Polls the cluster's state (the GCS ends a gone driver's actors asynchronously)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class ClosingStage(GraphStage):
    """A graph stage that notes where it was closed: a file named after the stage and the
    closing process, in a folder both the test and the nodes see (the cluster is on loopback)."""

    def __init__(self, name: str, graph: Any, marks: pathlib.Path) -> None:
        super().__init__(name, {"full": graph})
        self.marks = marks

    def close(self) -> None:
        (self.marks / f"{self.stage_name}-{os.getpid()}").touch()


def test_closing_the_engine_closes_each_stage_plugin_on_its_node(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    """The device actors' copies of the plugins are closed there (their models, files, helper
    processes) before the actors are killed; the control: nothing is closed while it serves."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # a test module's class
    stages = ("encode", "head")
    plugins = {stage: ClosingStage(stage, GRAPHS[f"{stage}/full"], tmp_path) for stage in stages}
    pinned = {"encode": "onnxruntime", "head": "openvino"}  # one stage on each node
    try:
        with Engine(policy_for(cluster), default_registry(), plugins=plugins, pinned=pinned) as e:
            settle(submit_all(e, 4))
            assert list(tmp_path.iterdir()) == []  # the control: serving closes nothing
            actors = [host.actor for host in e.models.values() if host.stages]
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    marks = [path.name.rsplit("-", 1) for path in tmp_path.iterdir()]
    on_nodes = sorted(stage for stage, pid in marks if int(pid) != os.getpid())
    assert on_nodes == sorted(stages)  # each closed by the actor that held it, once
    assert len(actors) == 2 and all(until(lambda a=a: lane_is_dead(a)) for a in actors)


def test_a_node_killed_mid_load_loses_nothing_and_a_joining_node_gets_work(
    cluster: Cluster,
) -> None:
    policy = policy_for(cluster)
    registry = default_registry()
    (worker_node,) = list(cluster.worker_nodes)
    worker = short(str(worker_node.node_id))
    with Engine(policy, registry, GRAPHS) as engine:
        first = settle(submit_all(engine, 16))  # round robin: both nodes serve
        assert {node_of(d) for r in first for d in r.devices.values()} == {
            worker,
            short(str(cluster.head_node.node_id)),
        }
        # The worker's processes are killed while a wave is in flight, and more arrive after.
        in_flight = submit_all(engine, 24)
        cluster.remove_node(worker_node, allow_graceful=False)
        later = submit_all(engine, 24)
        settle(in_flight + later)  # every request answered, each output right
        lost = [d.id for d in engine.fleet.devices if node_of(d.id) == worker]
        backend = engine.backends[RAY_BACKEND]
        # A call that hits a device of the dead node first takes that device out as an actor
        # that died (the node counts alive until Ray's health check misses it); the heartbeat
        # then finds the node gone, and every device of it, hit or not, is out as "left".
        for _ in range(10_000):
            if all("left" in (backend.health(d) or "") for d in lost):
                break
            settle(submit_all(engine, 1))
        assert all("left" in (backend.health(d) or "") for d in lost)
        with pytest.raises(DeviceUnhealthyError):  # no node to read it on
            backend.telemetry(lost[0])
        placed = len(engine.scheduler.decisions)
        tail = settle(submit_all(engine, 8))
        assert all(node_of(d) != worker for r in tail for d in r.devices.values())
        assert all(d.device_id not in lost for d in list(engine.scheduler.decisions)[placed:])

        # A node joins: the engine's heartbeat takes its device in; nobody calls add_devices.
        joined_node = cluster.add_node(**node_args(ONNXRUNTIME))
        cluster.wait_for_nodes()
        fresh = short(str(joined_node.node_id))
        for _ in range(10_000):
            wave = settle(submit_all(engine, 4))
            if any(node_of(d) == fresh for r in wave for d in r.devices.values()):
                break
        else:
            raise AssertionError("the joined node never received work")
        assert f"{ONNXRUNTIME}@{fresh}" in {d.id for d in engine.fleet.devices}
    assert connect(policy.spec.cluster).devices  # the connection outlives the engine


SIGTERM_PROBE = """\
import json, os, signal, sys, threading
import ray
from hetero.framework.cluster.signals import os_handler

mode, address = sys.argv[1], sys.argv[2]
got = threading.Event()
signal.signal(signal.SIGTERM, lambda signum, frame: got.set())
before = os_handler(signal.SIGTERM)


def join() -> None:  # on another thread, as hetero serve's model loader connects
    if mode == "connect":
        from hetero.framework.cluster.ray_cluster import connect
        from hetero.framework.policy.schema import ClusterConfig

        connect(ClusterConfig(engine="ray", address=address))
    else:
        ray.init(address=address, log_to_driver=False)


thread = threading.Thread(target=join)
thread.start()
thread.join()
assert ray.is_initialized(), "the probe did not connect"
kept = os_handler(signal.SIGTERM) == before
if kept:
    os.kill(os.getpid(), signal.SIGTERM)
    got.wait(60)
print(json.dumps({"kept": kept, "handled": got.is_set()}), flush=True)
ray.shutdown()
"""


@pytest.mark.parametrize(("mode", "kept"), [("connect", True), ("bare ray.init", False)])
def test_connecting_from_a_thread_leaves_sigterm_to_the_process(
    cluster: Cluster, mode: str, kept: bool
) -> None:
    """hetero's connect keeps the process's SIGTERM handler; a bare ray.init (the control)
    hands SIGTERM to Ray's failure handler, which aborts the process."""
    probe = subprocess.run(
        [sys.executable, "-c", SIGTERM_PROBE, mode, cluster.address],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    lines = [line for line in probe.stdout.splitlines() if line.startswith("{")]
    assert lines, probe.stderr
    assert json.loads(lines[-1]) == {"kept": kept, "handled": kept}, probe.stderr
    if kept:
        assert probe.returncode == 0, probe.stderr
