"""Warm-up on the real npu backend (ONNX Runtime and OpenVINO over the host CPU): a stage is
timed on every runtime that can run it, the figures are kept, and a later start that finds them
loads the stage only where placement will run it, saying why it left the other runtime idle."""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetero.backends.npu import NpuBackend
from hetero.framework.backend import Arrays, LoadedModel
from hetero.framework.engine import Engine
from hetero.framework.engine.calibration import CalibrationStore
from hetero.framework.engine.device_models import DeviceModels
from hetero.framework.engine.probing import CORE_SHARE_ITEMS, PROBE_RUNS, SPREAD_ITEMS
from hetero.framework.engine.warmup import WarmUp
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Detection, Registry
from hetero.framework.stage_plugin import GraphRunner, StagePlugin

OPENVINO = "npu:openvino/CPU"
ORT = "npu:onnxruntime/CPUExecutionProvider"

POLICY = """\
version: 1
devices: {allow: [npu]}
stages:
  encode:
    modality: text
    model_version: matmul@1
    variants:
      full: {max_batch: 8}
routes: {/encode: encode}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 5000}}
"""


def _graph() -> ComputeGraph:
    weight = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "encode",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    hint = BandwidthHint(flops_per_item=2 * weight.size, bytes_per_item=4 * weight.size)
    return ComputeGraph("encode", GraphFormat.ONNX, model.SerializeToString(), hint)


class ProbedStage(StagePlugin):
    """One matmul graph, with a probe so warm-up times it on each device."""

    name = "encode"
    batchable = True

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {"main": GRAPH}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        return [runner.run("main", payload) for payload in payloads]

    def probe_payload(self) -> Any:
        return {"x": np.ones((1, 64), np.float32)}


GRAPH = _graph()


class CountingBackend(NpuBackend):
    """The real npu backend over ONNX Runtime and OpenVINO, counting loads and runs per
    device."""

    loads: ClassVar[dict[str, int]] = {}
    runs: ClassVar[dict[str, int]] = {}
    order: ClassVar[list[str]] = []
    lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__(runtimes=("onnxruntime", "openvino"))

    def _load(self, executable: Any) -> tuple[Any, int]:
        with self.lock:
            self.loads[executable.device_id] = self.loads.get(executable.device_id, 0) + 1
        return super()._load(executable)

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        with self.lock:
            self.runs[model.device_id] = self.runs.get(model.device_id, 0) + 1
            self.order.append(model.device_id)
        return super()._run(model, inputs)


class RebuiltStage(ProbedStage):
    """Another plugin for the same model version (say, a new export of its weights)."""


def _start(
    store: CalibrationStore, plugin: StagePlugin | None = None, threads: int = 0
) -> tuple[Engine, dict[str, int], dict[str, int]]:
    """Warm an engine up with ``store`` (the stage on ``threads`` intra-op threads; 0: the
    runtimes' own choice); its status, and the loads and runs per device."""
    registry = Registry(use_entry_points=False)
    registry.register_backend("npu", lambda: Detection.found("npu", CountingBackend))
    CountingBackend.loads, CountingBackend.runs, CountingBackend.order = {}, {}, []
    policy = load_policy_text(POLICY, "calibrated.yaml")
    engine = Engine(
        policy,
        registry,
        plugins={"encode": plugin or ProbedStage()},
        threads={"encode": threads} if threads else None,
    )
    engine.warmer.calibrations = store
    engine.start()
    assert engine.warm_up() == {}
    return engine, dict(CountingBackend.loads), dict(CountingBackend.runs)


def test_a_start_with_kept_timings_loads_the_stage_only_where_it_will_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no core shares: which runtime is leaner is measured too, and may load both (the test
    # after this one)
    monkeypatch.setattr(WarmUp, "_core_share", lambda self, device_id, cores_busy: None)
    store = CalibrationStore(tmp_path / "calibration.json")
    first, loads, runs = _start(store)
    try:
        # No figures kept: both runtimes load the stage and run the probe (the control).
        assert loads.keys() == runs.keys() == {ORT, OPENVINO}
        # One untimed run on each (lazy initialisation), then the timed runs take turns, and
        # any more (while the first rounds cannot tell the two apart) take turns too.
        order = CountingBackend.order
        rounds = order[: 2 + 2 * PROBE_RUNS]
        assert set(order[:2]) == {ORT, OPENVINO} and rounds[2:] == order[:2] * PROBE_RUNS
        more = order[len(rounds) :]
        assert len(more) % 2 == 0 and all(
            set(more[i : i + 2]) == {ORT, OPENVINO} for i in range(0, len(more), 2)
        )
        timings = first.status["encode"].timings
        best = first.status["encode"].idle.keys() ^ {ORT, OPENVINO}
        (chosen,) = best
        (idle,) = first.status["encode"].idle
        assert "slower" in first.status["encode"].idle[idle]
        assert first.models[chosen].resident("encode/full")
        assert not first.models[idle].resident("encode/full")
        # each runtime's load, as timed when warm-up loaded it, is placement's figure
        loads_s = first.scheduler.tables["encode/full"].costs.load_s
        idle_load_s = float(loads_s[first.scheduler.fleet.index[idle]])
        # how far apart each runtime's timed runs were is kept beside its timing, and is
        # what the scheduler holds (what the probes could not tell apart is tried in service)
        kept = json.loads((tmp_path / "calibration.json").read_text())
        spreads = [v for k, v in kept.items() if k.split("|")[6] == repr(SPREAD_ITEMS)]
        assert len(spreads) == 2 and all(spread >= 1.0 for spread in spreads)
        first_spreads = dict(first.scheduler._probe_spread)
        assert sorted(first_spreads.values()) == sorted(spreads)
        # why the other runtime is idle names the spread exactly when it is within it
        untold = timings[idle] < max(spreads) * timings[chosen]
        assert ("within the probes' own spread" in first.status["encode"].idle[idle]) == untold
    finally:
        first.close()
    second, loads, runs = _start(store)
    try:
        # Both figures kept: only the runtime placement uses loads it (and times it again,
        # for admission's pace); the other is never loaded, and says why it is idle.
        assert loads == {chosen: 1}
        assert runs.keys() == {chosen}
        # the runtime left unloaded keeps the load time the first start measured (without
        # the kept figure it would be the cost model's guess: a set-up plus the bytes)
        kept_load_s = second.scheduler.tables["encode/full"].costs.load_s
        assert float(kept_load_s[second.scheduler.fleet.index[idle]]) == idle_load_s
        assert second.scheduler._probe_spread == first_spreads  # the kept spreads, both
        status = second.status["encode"]
        assert "kept from an earlier start" in status.idle[idle]
        # The chosen runtime was timed again; the kept figure of the other moved with it (in
        # placement and in what the status reports), so both rank them as they were measured
        # side by side.
        estimate = second.scheduler.estimate_s
        ratio = estimate("encode", "full", idle) / estimate("encode", "full", chosen)
        assert ratio == pytest.approx(timings[idle] / timings[chosen])
        assert status.timings[idle] / status.timings[chosen] == pytest.approx(ratio)
        # Warmed up again (a reload, a failed stage retried): why a runtime is idle is
        # judged afresh, and what was said of a device no longer there goes.
        status.idle["npu:gone/CPU"] = "slower: a device that left"
        status.timings["npu:gone/CPU"] = "unavailable: a device that left"
        status.state = "pending"
        assert second.warm_up() == {}
        assert status.idle.keys() == {idle} and "npu:gone/CPU" not in status.timings
    finally:
        second.close()


def test_kept_timings_belong_to_the_plugin_that_built_the_graph(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path / "calibration.json")
    _start(store)[0].close()
    again, loads, _ = _start(store)  # the control: the same plugin loads one runtime
    again.close()
    assert len(loads) == 1
    rebuilt, loads, _ = _start(store, RebuiltStage())
    rebuilt.close()
    assert loads.keys() == {ORT, OPENVINO}  # another plugin's graph is timed afresh


def _doctor(
    path: Path, seconds: dict[str, float], shares: dict[str, float], spread: float = 1.0
) -> None:
    """Set the kept probe timings, core shares and probe spreads (one for every runtime) in
    the file at ``path``."""
    kept = json.loads(path.read_text())
    for key in list(kept):
        fields = key.split("|")
        device, items = fields[3], float(fields[6])
        if items == CORE_SHARE_ITEMS:
            kept[key] = shares[device]
        elif items == SPREAD_ITEMS:
            kept[key] = spread
        elif items > 0:
            kept[key] = seconds[device]
    path.write_text(json.dumps(kept))


@pytest.mark.parametrize(("ort_share", "spread"), [(0.5, 1.0), (1.0, 1.0), (0.5, 2.0)])
def test_the_runtime_leaner_on_busy_cores_is_not_idle_and_not_loaded_yet(
    tmp_path: Path, ort_share: float, spread: float
) -> None:
    path = tmp_path / "calibration.json"
    store = CalibrationStore(path)
    first, _, _ = _start(store)
    try:
        # each runtime's share of the cores its probe kept busy is kept beside its timing,
        # and is what the scheduler holds
        kept = json.loads(path.read_text())
        shares = {
            k.split("|")[3]: v for k, v in kept.items() if k.split("|")[6] == repr(CORE_SHARE_ITEMS)
        }
        assert shares.keys() == {ORT, OPENVINO}
        assert all(0.0 < share <= 1.0 for share in shares.values())
        assert {d: first.scheduler.core_share_of("encode", d) for d in shares} == shares
    finally:
        first.close()
    # OpenVINO 10 % faster alone; ONNX Runtime keeping half the cores busy that it does (or,
    # the control, as many: then it is not leaner, and idle); the probes' runs 1.0x apart (or
    # 2.0x: then the shares' 1.8x is within their noise, and ONNX Runtime idle too)
    _doctor(path, {OPENVINO: 0.010, ORT: 0.011}, {OPENVINO: 1.0, ORT: ort_share}, spread)
    second, loads, _ = _start(CalibrationStore(path))
    try:
        status = second.status["encode"]
        assert second.models[OPENVINO].resident("encode/full")
        # loaded by the first task placed while the cores are busy, not at warm-up
        assert ORT not in loads and not second.models[ORT].resident("encode/full")
        assert (ORT in status.idle) == (ort_share == 1.0 or spread == 2.0)
        assert second.scheduler.core_share_of("encode", ORT) == ort_share
    finally:
        second.close()


@pytest.mark.parametrize("threads", [2, 1])
def test_a_runtime_narrowed_under_contention_is_timed_on_its_narrow_copy_too(
    tmp_path: Path, threads: int
) -> None:
    """A stage on two threads runs contended batches on a one-thread copy
    (engine.thread_budget): warm-up times that copy on each runtime as well, keeps the share it
    gives, and gives the copy back, so the best runtime holds only the stage's own copy. The
    control: a stage on one thread has no narrower copy, and each runtime loads once."""
    path = tmp_path / "calibration.json"
    engine, loads, _ = _start(CalibrationStore(path), threads=threads)
    try:
        copies = 2 if threads > 1 else 1
        assert loads == {ORT: copies, OPENVINO: copies}
        (best,) = [d for d in (ORT, OPENVINO) if engine.models[d].resident("encode/full")]
        host = engine.models[best]
        assert isinstance(host, DeviceModels)
        assert [key[2] for key in host._loaded] == [threads]  # the narrow copy went back
        kept = json.loads(path.read_text())
        shares = [v for k, v in kept.items() if k.split("|")[6] == repr(CORE_SHARE_ITEMS)]
        assert len(shares) == 2 and all(0.0 < share <= 1.0 for share in shares)
    finally:
        engine.close()
    again, loads, _ = _start(CalibrationStore(path), threads=threads)  # kept: none timed again
    again.close()
    assert loads == {best: 1}


def test_the_narrow_copy_is_timed_with_runs_side_by_side_filling_the_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load a narrow copy's run has other runs beside it on the cores, so warm-up times
    it that way: as many callers as the cores hold one-thread runs, each its untimed run and
    its NARROW_RUNS timed ones. The control: the stage's own two-thread copy is timed by one
    caller, warm-up's own thread."""
    callers: dict[int, set[str]] = defaultdict(set)
    run_batch = DeviceModels.run_batch

    def counted(self: DeviceModels, *args: Any, **kwargs: Any) -> Any:
        threads = args[3] if len(args) > 3 else kwargs["threads"]
        callers[threads].add(threading.current_thread().name)
        return run_batch(self, *args, **kwargs)

    monkeypatch.setattr(DeviceModels, "run_batch", counted)
    engine, _, _ = _start(CalibrationStore(tmp_path / "calibration.json"), threads=2)
    engine.close()
    cores = len(os.sched_getaffinity(0))
    share_threads = {name for name in callers[1] if name.startswith("hetero-share")}
    assert len(share_threads) == max(1, cores)  # one-thread runs: one per core
    assert len(callers[2]) == 1 and not any(n.startswith("hetero-share") for n in callers[2])
