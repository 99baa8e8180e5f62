"""Runtimes of one host's cores weighed by the cores they take, while other work runs there.

Warm-up times each runtime of a host CPU (OpenVINO, ONNX Runtime, torch) alone, in wall time:
that is what a task waits when nothing else runs on the cores. But runtimes differ in how many
of the cores a run keeps busy (its process CPU time over its wall time, over the cores): on
the two-core bench machine OpenVINO's embedder finishes a probe 3 % sooner than ONNX Runtime's
and keeps 0.99 of the cores busy against 0.81. Alone the faster one is right; while another
model runs on the same cores, the cores are the bottleneck, and a run's cost is the core time
it takes from the work beside it: there the 3 % faster runtime costs 18 % more.

So a runtime's **core share** (measured at warm-up, kept with its timing: for a runtime whose
contended batches run on a copy with fewer threads, from that copy's timing; otherwise from
the process's CPU time over its run alone: ``engine.warmup``) weighs its compute
estimate while the compute resource is busy (a task of any stage in flight on one of its
devices, or another request live in the engine: between its tasks and while its answer is
written, a request's host work, HTTP, JSON and pre-processing, runs on the same cores): by its
share over the least share of the resource's runtimes that run the stage
(1 for the leanest, more for the others). While the cores are idle the estimate is the wall
time alone, as before. Warm-up loads only the runtime fastest alone; the leanest is loaded by
the first task placed while the cores are busy (its load is not counted against it then,
when it fits in free memory without evicting anything), so a server that never sees
concurrent work never holds its copy. A simulated fleet, or a device that is not a host CPU,
has no share: its estimates never change.

While the cores are busy, the shares move a stage off the runtime fastest alone only where
the evidence is outside the probes' own noise: when the fastest alone's weighed estimate is
within the spread of warm-up's timed runs
(:meth:`~hetero.framework.scheduler.estimates.EstimatesMixin.probe_spread`, on either runtime)
of the leanest's, the stage stays where it runs alone. The shares are measured once, at
warm-up, on a machine whose probes run 1.25-2.1x apart; shares a few percent apart moved the
bench's images to OpenVINO under load, 0.94x and 0.96x pinned ONNX Runtime's throughput at
concurrency 8 and 32 (docs/scheduler.md). Where the busy estimates differ by more than that,
the leaner runtime takes the task.
"""

from __future__ import annotations

import numpy as np

from hetero.framework.scheduler.state import SchedulerState
from hetero.framework.scheduler.tables import StageTables

__all__ = ["CoreSharesMixin"]


class CoreSharesMixin(SchedulerState):
    """Core shares per (stage, device) and the weights they give placement."""

    #: Requests live in the engine (admitted and not yet answered), kept by its graph runner.
    requests_live = 0

    def probe_core_share(self, stage: str, device_id: str, share: float) -> None:
        """Warm-up's probe of ``stage`` on ``device_id`` kept ``share`` of the host's cores
        busy (its process CPU time over its wall time, over the cores; at most 1). While other
        work runs on those cores, placement weighs the device's estimate by its share over
        the least share among the runtimes of the same cores (module docstring)."""
        if not 0.0 < share <= 1.0:
            return
        self._core_share[(stage, self.fleet.index[device_id])] = share
        self._core_weights[stage] = self._weights_of(stage)

    def core_share_of(self, stage: str, device_id: str) -> float | None:
        """The share :meth:`probe_core_share` was given (None: none was measured)."""
        return self._core_share.get((stage, self.fleet.index[device_id]))

    def busy_estimate_s(self, stage: str, variant: str, device_id: str) -> float:
        """One item's estimate on ``device_id`` while its cores run other work as well: the
        idle estimate times the device's weight (:meth:`probe_core_share`)."""
        weights = self._core_weights.get(stage)
        index = self.fleet.index[device_id]
        weight = float(weights[index]) if weights is not None and index < len(weights) else 1.0
        tables = self.tables.get(f"{stage}/{variant}") or self.tables[f"{stage}/full"]
        return float(tables.unit_s[index]) * weight

    def _busy_load(
        self, stage: str, tables: StageTables, weight: np.ndarray, busy: np.ndarray
    ) -> np.ndarray:
        """The load term while the cores are busy (``busy``: per device, its resource is):
        none for the leanest runtime of a busy resource (weight 1 with a share measured)
        where it is not loaded and fits in free memory without evicting anything (module
        docstring)."""
        waived = [
            int(index)
            for index in np.flatnonzero(busy & (weight == 1.0))
            if (stage, int(index)) in self._core_share
            and not tables.resident[index]
            and self.memory[int(index)].free >= int(tables.resident_bytes[index])
        ]
        if not waived:
            return tables.load_now
        load: np.ndarray = tables.load_now.copy()
        load[waived] = 0.0
        return load

    def _fastest_alone_within_spread(
        self, stage: str, best: int, total: np.ndarray, alone: np.ndarray, mask: np.ndarray
    ) -> int:
        """While ``best``'s cores are busy (``total``: the estimates weighed by the shares,
        ``alone``: unweighed): the runtime of its compute resource in ``mask`` fastest alone,
        where its weighed estimate is within the probes' spread of ``best``'s (on either of
        the two: warm-up could not tell them apart); else ``best`` (module docstring)."""
        groups = self._compute_group
        members = np.flatnonzero(mask & (groups == groups[best]))
        fastest = int(members[np.argmin(alone[members])])
        if fastest == best:
            return best
        moved = self._beyond_spread(stage, best, fastest, float(total[best]), float(total[fastest]))
        return best if moved else fastest

    def shares_move(self, stage: str, fastest_id: str, leanest_id: str) -> bool:
        """Whether, while the cores are busy, ``leanest_id`` takes ``stage``'s tasks from
        ``fastest_id`` (fastest alone): its estimate weighed by the shares beats the other's
        by more than the probes' spread (module docstring)."""
        index = self.fleet.index
        return self._beyond_spread(
            stage,
            index[leanest_id],
            index[fastest_id],
            self.busy_estimate_s(stage, "full", leanest_id),
            self.busy_estimate_s(stage, "full", fastest_id),
        )

    def _beyond_spread(
        self, stage: str, lean: int, fastest: int, lean_cost: float, fastest_cost: float
    ) -> bool:
        """Whether ``lean``'s busy estimate is below ``fastest``'s by more than the spread of
        the probes on either of the two."""
        spread = self._probe_spread
        band = max(spread.get((stage, lean), 1.0), spread.get((stage, fastest), 1.0))
        return fastest_cost > lean_cost * band

    def _weights_of(self, stage: str) -> np.ndarray:
        """Each device's share over the least share among the devices of its compute
        resource that have one for ``stage`` (1 where none was measured)."""
        groups = self._compute_group
        least: dict[int, float] = {}
        for (name, index), share in self._core_share.items():
            if name == stage and index < len(groups):
                group = int(groups[index])
                least[group] = min(least.get(group, share), share)
        weights = np.ones(len(self.devices))
        for (name, index), share in self._core_share.items():
            if name == stage and index < len(groups):
                weights[index] = share / least[int(groups[index])]
        return weights

    def _busy_weight(self, stage: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The weights of ``stage`` where a device's compute resource has a task in flight
        (1 elsewhere), and that busy mask; None when no weight applies now."""
        weights = self._core_weights.get(stage)
        if weights is None:
            return None
        if len(weights) != len(self.devices):  # the fleet grew: groups were renumbered
            weights = self._core_weights[stage] = self._weights_of(stage)
        busy = self._busy_groups()
        if not busy.any():
            return None
        weighted: np.ndarray = np.where(busy, weights, 1.0)
        return weighted, busy

    def cores_contended(self, device_id: str, own_tasks: int) -> bool:
        """Whether other work shares ``device_id``'s compute resource with a batch of
        ``own_tasks`` tasks: more tasks in flight there (dispatched and not yet done, of any
        stage and runtime on those cores) than the batch's own. Another live request alone
        does not count (its HTTP work is not a run): narrowing for it left a core idle
        whenever one stage had work and the other none. Read by a lane without the engine's
        lock: a hint, as fresh as the last dispatch."""
        groups, in_flight = self._compute_group, self.in_flight
        index = self.fleet.index.get(device_id)
        if index is None or index >= len(groups) or len(groups) != len(in_flight):
            return False  # the fleet is being renumbered: no evidence of contention
        return int(in_flight[groups == groups[index]].sum()) > own_tasks

    def _busy_groups(self) -> np.ndarray:
        """Per device: whether a task of any stage is in flight on its compute resource, or
        (every device) whether another request is live: counting tasks alone, a placement
        between other requests' tasks (theirs parsed, answered or waiting for their next
        stage, on the same cores) saw idle cores under load and chose the runtime fastest
        alone, which takes the most core time. Only a host CPU's runtimes have a share, so on
        any other device the mask changes nothing."""
        if self.requests_live > 1:
            return np.ones(len(self.devices), dtype=bool)
        groups = self._compute_group
        busy: np.ndarray = (
            np.bincount(groups, weights=self.in_flight, minlength=self._groups)[groups] > 0
        )
        return busy
