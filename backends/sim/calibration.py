"""Calibration of the sim backend's modelled times against measured tables.

The roofline (FLOPs over peak, bytes over bandwidth) is what a device could do; real serving
reaches a fraction of it. The fractions below come from measurements and are the one source of
those numbers; :func:`fit_splitwise` and :func:`fit_load_spread` recompute them from the traces
(``../shared/data/traces/``, third-party files, not shipped), and
``tests/unit/test_sim_calibration.py`` checks the figures here match them when the files are
present.

* **Prompt and decode efficiency** (``RooflineEfficiency``): SplitwiseSim's measured
  performance model (``splitwise_perf_model/perf_model.csv``, Patel et al., ISCA'24, MIT):
  llama2-70b in fp16 with tensor parallelism 2 on DGX-A100 (``a100-80gb``) and DGX-H100
  (``h100-80gb``). For each measured row, prefill roofline = batch x prompt tokens x 2 x 69e9
  FLOPs / 2 GPUs over the GPU's dense fp16 peak; decode-step roofline = (69e9 x 2 bytes of
  weights + the batch's KV cache at mid-generation, 327,680 bytes per token for llama2-70b's
  grouped-query attention) / 2 GPUs over its memory bandwidth. The efficiency is the median of
  roofline over measured time. Devices the table does not cover (MI300X, Ascend, Xeon, H200)
  take the mean of the two, an extrapolation said as such in docs/simulator.md.
* **Load-time spread** (``LOAD_SPREAD``): Alibaba GenTD26's base-model load latencies
  (``alibaba_gentd26/basemodel_update_latency_anon.tar.gz``, 7,531 production loads of
  Stable-Diffusion base models, SoCC'25): the quantiles of load time over its median. Their
  absolute times (median 22.7 s) include pulling from remote storage and are not ours; their
  shape (how much slower the slow loads are) is what the simulator borrows, as a multiplier on
  the modelled load (resident bytes over the host link plus initialisation).
"""

from __future__ import annotations

import csv
import io
import statistics
import tarfile
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pyrsistent import pmap

__all__ = [
    "LOAD_SPREAD",
    "ROOFLINE_EFFICIENCY",
    "RooflineEfficiency",
    "efficiency_for",
    "fit_load_spread",
    "fit_splitwise",
    "load_multiplier",
]


@dataclass(frozen=True, slots=True)
class RooflineEfficiency:
    """Measured time = roofline time / efficiency, per LLM phase."""

    prefill: float
    decode: float


# fit_splitwise() on perf_model.csv @ Mutinifni/splitwise-sim 378088013a54.
ROOFLINE_EFFICIENCY: Mapping[str, RooflineEfficiency] = pmap(
    {
        "A100-SXM4-80GB": RooflineEfficiency(prefill=0.579, decode=0.568),
        "H100-SXM5-80GB": RooflineEfficiency(prefill=0.428, decode=0.554),
    }
)

# fit_load_spread() on basemodel_update_latency_anon.csv @ alibaba/clusterdata 754fa762065a:
# load time over the median at the 5th, 15th, ..., 95th percentiles (ten equal-mass bins).
LOAD_SPREAD: tuple[float, ...] = (
    0.101,
    0.122,
    0.138,
    0.334,
    0.943,
    1.066,
    1.453,
    1.625,
    1.753,
    2.001,
)

# The splitwise rows' model: llama2-70b, fp16, over two GPUs.
_PARAMS = 69e9
_KV_BYTES_PER_TOKEN = 327_680.0
_TP = 2
_HARDWARE = {"a100-80gb": "A100-SXM4-80GB", "h100-80gb": "H100-SXM5-80GB"}
# Dense fp16 peak and memory bandwidth of the two presets (hetero.framework.device_presets).
_FIGURES = {"A100-SXM4-80GB": (312e12, 2039e9), "H100-SXM5-80GB": (989.4e12, 3.35e12)}


def efficiency_for(preset: str | None) -> RooflineEfficiency:
    """The measured efficiency of a preset; the mean of the measured ones for any other."""
    if preset is not None and preset in ROOFLINE_EFFICIENCY:
        return ROOFLINE_EFFICIENCY[preset]
    known = list(ROOFLINE_EFFICIENCY.values())
    return RooflineEfficiency(
        prefill=statistics.fmean(e.prefill for e in known),
        decode=statistics.fmean(e.decode for e in known),
    )


def load_multiplier(uniform: float) -> float:
    """A load time over its modelled value, drawn from :data:`LOAD_SPREAD` by ``uniform`` in
    [0, 1) (inverse transform over the equal-mass bins); 1 when no spread is known."""
    if not LOAD_SPREAD:
        return 1.0
    return LOAD_SPREAD[min(int(uniform * len(LOAD_SPREAD)), len(LOAD_SPREAD) - 1)]


def fit_splitwise(path: Path) -> dict[str, RooflineEfficiency]:
    """Prefill and decode efficiency per preset from SplitwiseSim's perf_model.csv."""
    prefill: dict[str, list[float]] = defaultdict(list)
    decode: dict[str, list[float]] = defaultdict(list)
    with path.open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            preset = _HARDWARE.get(row["hardware"])
            if row["model"] != "llama2-70b" or preset is None or int(row["tensor_parallel"]) != _TP:
                continue
            peak, bandwidth = _FIGURES[preset]
            batch, prompt = int(row["batch_size"]), int(row["prompt_size"])
            generated = int(row["token_size"])
            prefill_roofline = batch * prompt * 2 * _PARAMS / _TP / peak
            context = batch * (prompt + generated / 2) * _KV_BYTES_PER_TOKEN
            decode_roofline = (2 * _PARAMS + context) / _TP / bandwidth
            prefill[preset].append(prefill_roofline / (float(row["prompt_time"]) / 1e3))
            decode[preset].append(decode_roofline / (float(row["token_time"]) / 1e3))
    return {
        preset: RooflineEfficiency(
            prefill=round(statistics.median(prefill[preset]), 3),
            decode=round(statistics.median(decode[preset]), 3),
        )
        for preset in sorted(prefill)
    }


def _latencies(archive: Path) -> Iterable[float]:
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            if handle is None:
                continue
            for row in csv.DictReader(io.TextIOWrapper(handle, encoding="utf-8")):
                yield float(row["value"])


def fit_load_spread(archive: Path, bins: int = 10) -> tuple[float, ...]:
    """Load time over its median at the middle of ``bins`` equal-mass bins, from GenTD26."""
    values = sorted(_latencies(archive))
    median = statistics.median(values)
    quantiles = [values[int((i + 0.5) / bins * len(values))] for i in range(bins)]
    return tuple(round(q / median, 3) for q in quantiles)
