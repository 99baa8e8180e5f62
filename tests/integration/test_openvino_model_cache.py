"""OpenVINO keeps compiled models in hetero's model cache and a later start imports them, and
compiles CPU models with unpinned threads (framework/executors/openvino_executor.py); real
OpenVINO on this CPU."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from hetero.framework.executors.openvino_executor import OpenVinoExecutor, cpu_streams


def _onnx() -> bytes:
    weight = np.random.default_rng(3).standard_normal((32, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _run(executor: OpenVinoExecutor, source: bytes) -> np.ndarray:
    compiled = executor.compile(executor.read(source), "CPU")
    return np.asarray(compiled.run({"x": np.ones((1, 32), np.float32)})["y"])


def test_a_compiled_model_is_kept_and_the_next_executor_imports_the_same_model(
    tmp_path: Path,
) -> None:
    source = _onnx()
    cache = tmp_path / "openvino"
    first = OpenVinoExecutor(cache_dir=cache)
    assert first.cache_dir == cache
    expected = _run(first, source)
    kept = sorted(p.name for p in cache.iterdir())
    assert kept  # the compiled model, on disk
    second = OpenVinoExecutor(cache_dir=cache)
    assert np.array_equal(_run(second, source), expected)
    assert sorted(p.name for p in cache.iterdir()) == kept  # imported, not compiled anew
    plain = OpenVinoExecutor()
    assert np.array_equal(_run(plain, source), expected)  # the control: no cache, same result


def test_a_cache_folder_that_cannot_be_made_compiles_every_time(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    executor = OpenVinoExecutor(cache_dir=blocker / "openvino")
    assert executor.cache_dir is None
    assert _run(executor, _onnx()).shape == (1, 32)


def test_a_cpu_model_keeps_its_threads_per_run_and_leaves_them_unpinned() -> None:
    """A run takes the threads asked for, and as many runs as the cores hold go side by side
    (a stream each: one stream runs one request at a time); the whole-core model has one."""
    executor = OpenVinoExecutor()
    cores = len(os.sched_getaffinity(0))
    compiled = executor.compile(executor.read(_onnx()), "CPU", threads=1).compiled
    streams = int(compiled.get_property("NUM_STREAMS"))
    assert streams == cpu_streams(1) == cores
    assert int(compiled.get_property("INFERENCE_NUM_THREADS")) == streams  # one per run
    whole = executor.compile(executor.read(_onnx()), "CPU", threads=cores).compiled
    assert int(whole.get_property("NUM_STREAMS")) == 1
    assert int(whole.get_property("INFERENCE_NUM_THREADS")) == cores
    # pinned, two one-thread models side by side can share one core (the compile docstring)
    assert compiled.get_property("ENABLE_CPU_PINNING") is False
