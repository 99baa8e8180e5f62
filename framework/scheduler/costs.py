"""Static cost tables, computed once per fleet so a placement decision is a few vector ops.

For every (stage, variant) and device: whether the device may run it (class allowed, variant
runnable, model fits), the roofline time of the k-th item added to a forming batch, the load time
(resident bytes over the host link plus a fixed init), and, for every pair of devices, the
latency and inverse bandwidth of the cheapest route (so a transfer of n bytes costs
``latency + n * inverse_bandwidth``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import BandwidthHint
from hetero.framework.topology import Topology, host_link

__all__ = ["FleetCosts", "StageCosts"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# Fixed cost of bringing a model up besides moving its bytes (allocator, graph build): a model.
LOAD_INIT_S = 0.05
# Transfers are routed once for this size; the route's cost is then affine in the size.
ROUTE_PROBE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class StageCosts:
    """Per-device tables of one (stage, variant)."""

    key: str
    stage: str
    variant: str
    hint: BandwidthHint
    runnable: BoolArray
    marginal_s: FloatArray  # [devices, max_batch]: time the k-th item adds to a forming batch
    load_s: FloatArray
    min_residency_s: float
    why_not: tuple[str, ...]  # per device: "" or the static reason it cannot run this


class FleetCosts:
    """Devices, their host links and pairwise routes, and every stage's tables."""

    def __init__(
        self, devices: Sequence[DeviceSpec], topology: Topology, capacity: Sequence[int]
    ) -> None:
        self.devices = tuple(devices)
        self.index = {device.id: i for i, device in enumerate(self.devices)}
        self.capacity = np.asarray(capacity, dtype=np.int64)
        count = len(self.devices)
        self.route_latency = np.zeros((count, count))
        self.route_inverse_bandwidth = np.zeros((count, count))
        for i, src in enumerate(self.devices):
            for j, dst in enumerate(self.devices):
                if i == j:
                    continue
                hops = topology.route(ROUTE_PROBE_BYTES, src.id, dst.id)
                self.route_latency[i, j] = sum(h.latency_s for h in hops)
                self.route_inverse_bandwidth[i, j] = sum(1 / h.bandwidth_bytes_per_s for h in hops)
        self.ingress_inverse_bandwidth = np.array([1 / host_link(d)[0] for d in self.devices])

    def stage(
        self,
        stage: str,
        variant: str,
        hint: BandwidthHint,
        allowed_classes: Sequence[str],
        min_residency_s: float,
        can_run: Callable[[str, str, str], bool],
    ) -> StageCosts:
        """Tables for one (stage, variant)."""
        count = len(self.devices)
        runnable = np.zeros(count, dtype=bool)
        marginal = np.zeros((count, hint.max_batch))
        load = np.zeros(count)
        why_not: list[str] = []
        for i, device in enumerate(self.devices):
            peak = device.peak_flops_for(hint.dtype)
            bandwidth = device.memory_bandwidth_bytes_per_s
            times = [0.0] + [
                hint.batch_seconds(peak, bandwidth, k) for k in range(1, hint.max_batch + 1)
            ]
            marginal[i] = np.diff(times)  # the first item carries the weights' read
            load[i] = LOAD_INIT_S + hint.resident_bytes / host_link(device)[0]
            reason = ""
            if device.device_class.value not in allowed_classes:
                reason = f"class {device.device_class.value} not allowed"
            elif hint.resident_bytes > self.capacity[i]:
                reason = "model larger than the device's memory after the reserve"
            elif not can_run(stage, variant, device.id):
                reason = "its backend cannot run this variant's graph"
            runnable[i] = not reason
            why_not.append(reason)
        return StageCosts(
            key=f"{stage}/{variant}",
            stage=stage,
            variant=variant,
            hint=hint,
            runnable=runnable,
            marginal_s=marginal,
            load_s=load,
            min_residency_s=min_residency_s,
            why_not=tuple(why_not),
        )
