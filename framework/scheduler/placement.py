"""Placement: which eligible device a task goes to, by the cost model (queue + load + compute +
transfer, vectorised over the fleet) or a baseline (round robin, least connections, power of two
choices, best runtime pinned), and why a task can go nowhere."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from hetero.framework.scheduler.breakers import BreakerState
from hetero.framework.scheduler.completion import CompletionMixin
from hetero.framework.scheduler.core_shares import CoreSharesMixin
from hetero.framework.scheduler.costs import StageCosts
from hetero.framework.scheduler.tables import StageTables
from hetero.framework.scheduler.tasks import StageTask

__all__ = ["BOUNDED_SEARCH_MIN_DEVICES", "PlacementMixin"]

# From this many devices (and more than one host) cost-model placement searches hosts by branch
# and bound instead of costing every device; the answer is the same. Measured side by side
# (docs/cluster.md, fourth round): 0.6-0.7x the full scan's speed at 1,000 devices, 0.9-1.05x
# at 10,000, 1.3-1.4x at 20,000, 1.6-2.0x at 40,000.
BOUNDED_SEARCH_MIN_DEVICES = 15_000


@dataclass
class _Baselines:
    """What the baseline placements keep: power of two choices' draws (seeded, so a run
    repeats), and best runtime pinned's devices per stage variant (with the costs they were
    chosen by: new costs, a new choice)."""

    draws: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    pinned: dict[str, tuple[StageCosts, np.ndarray]] = field(default_factory=dict)


class PlacementMixin(CompletionMixin, CoreSharesMixin):
    """Eligibility masks and the choice of a device among them."""

    @functools.cached_property
    def _baselines(self) -> _Baselines:
        return _Baselines()

    def _group_backlog(self) -> np.ndarray:
        """Each device's backlog summed over the devices that share its compute."""
        groups = self._compute_group
        summed: np.ndarray = np.bincount(groups, weights=self.backlog)[groups]
        return summed

    def _refresh_breakers(self, stage: str, now: float) -> np.ndarray:
        blocked = self._breaker_blocked[stage]
        not_closed = self._not_closed[stage]
        if not not_closed:
            return blocked
        for index in list(not_closed):
            breaker = self._breakers[(stage, index)]
            blocked[index] = not breaker.allows(now)
            if breaker.state is BreakerState.CLOSED:
                self._not_closed[stage].discard(index)
        return blocked

    def _transfer(self, task: StageTask, tables: StageTables) -> np.ndarray:
        fleet = self.fleet
        if not task.inputs:
            size = tables.costs.hint.input_bytes * task.items
            return size * fleet.ingress_inverse_bandwidth
        if self.outputs_on_host:
            return sum(h.size_bytes for h in task.inputs) * fleet.ingress_inverse_bandwidth
        total: np.ndarray | None = None
        for handle in task.inputs:
            src = fleet.index.get(handle.device_id)
            if src is None:
                # The device that holds the output is gone (unhealthy, removed): the engine
                # keeps outputs as host arrays, so it costs a host-to-device copy.
                cost = handle.size_bytes * fleet.ingress_inverse_bandwidth
            else:
                latency, inverse_bandwidth = fleet.routes_from(src)
                cost = latency + handle.size_bytes * inverse_bandwidth
            if total is None:
                total = cost  # a fresh array; 0 + cost would be the same figures
            else:
                total += cost
        assert total is not None
        return total

    def _before_transfer(
        self, backlog: np.ndarray, load: np.ndarray, compute: np.ndarray
    ) -> np.ndarray:
        """The estimate before transfer, weighted: the one expression both searches use, so
        they add the same figures in the same order."""
        if self._unit_weights:
            local: np.ndarray = backlog + load + compute
            return local
        w = self.weights
        weighted: np.ndarray = w.queue * backlog + w.load * load + w.compute * compute
        return weighted

    def _with_transfer(self, local: np.ndarray, transfer: np.ndarray) -> np.ndarray:
        if self._unit_weights:
            total: np.ndarray = local + transfer
            return total
        weighted: np.ndarray = local + self.weights.transfer * transfer
        return weighted

    def _choose(
        self, task: StageTask, tables: StageTables, mask: np.ndarray
    ) -> tuple[int, dict[str, float]] | None:
        if not np.count_nonzero(mask):  # faster than ndarray.any() on small arrays
            return None
        backlog = self._group_backlog() if self._grouped else self.backlog
        # core shares (measured on a real host's runtimes) weigh the full scan only
        weighted = bool(self._core_weights) and task.stage in self._core_weights
        bounded = self._bounded_search and task.items >= 1 and not weighted
        if self.placement == "cost_model" and bounded:
            found = self._choose_bounded(task, tables, mask, backlog)
            if found is not None:
                return found
        compute = tables.next_compute if task.items == 1 else tables.next_compute * task.items
        load = tables.load_now
        busy_mask, alone_compute = None, compute
        if weighted and self.placement == "cost_model":
            busy = self._busy_weight(task.stage)  # cores busy: the core time taken counts
            if busy is not None:
                weight, busy_mask = busy
                compute = compute * weight
                load = self._busy_load(task.stage, tables, weight, busy_mask)
        transfer = self._transfer(task, tables)
        if self.placement == "round_robin":
            candidates = np.flatnonzero(mask)
            after = candidates[candidates > self._round_robin[task.stage]]
            index = int(after[0] if after.size else candidates[0])
            self._round_robin[task.stage] = index
        elif self.placement == "least_connections":
            index = int(np.argmin(np.where(mask, self.in_flight, np.iinfo(np.int64).max)))
        elif self.placement == "power_of_two":
            index = self._two_choices_of(mask)
        elif self.placement == "pinned_fastest":
            pinned = self._pinned_mask(tables)
            if np.count_nonzero(pinned & self.healthy):  # else: every pinned device is down
                mask = mask & pinned
                if not np.count_nonzero(mask):
                    return None  # the pinned devices are full: wait for them, as a pin does
            index = int(np.argmin(np.where(mask, self.in_flight, np.iinfo(np.int64).max)))
        else:
            total = self._with_transfer(self._before_transfer(backlog, load, compute), transfer)
            index = int(np.where(mask, total, np.inf).argmin())
            if busy_mask is not None and busy_mask[index]:
                alone = self._with_transfer(
                    self._before_transfer(backlog, tables.load_now, alone_compute), transfer
                )
                index = self._fastest_alone_within_spread(task.stage, index, total, alone, mask)
        terms = {
            "queue": float(backlog[index]),
            "load": float(load[index]),
            "compute": float(compute[index]),
            "transfer": float(transfer[index]),
        }
        return index, terms

    def _two_choices_of(self, mask: np.ndarray) -> int:
        """Power of two choices: of two candidates drawn at random (seeded), the one with fewer
        tasks in flight (the first drawn on a tie)."""
        candidates = np.flatnonzero(mask)
        if candidates.size == 1:
            return int(candidates[0])
        first, second = self._baselines.draws.choice(candidates.size, 2, replace=False).tolist()
        a, b = int(candidates[first]), int(candidates[second])
        return b if self.in_flight[b] < self.in_flight[a] else a

    def _pinned_mask(self, tables: StageTables) -> np.ndarray:
        """Best runtime pinned: the devices of the one kind (device class, runtime, model of
        processor) on which a single item of this stage variant runs fastest by the policy's
        figures, as a person pinning each model to its best runtime would choose; the
        devices of that kind are then shared by least connections."""
        kept = self._baselines.pinned.get(tables.costs.key)
        if kept is not None and kept[0] is tables.costs:
            return kept[1]
        costs = tables.costs
        unit = costs.marginal_s[:, 0]
        kinds: dict[tuple[str, str, str], list[int]] = {}
        for index, device in enumerate(self.devices):
            if costs.runnable[index]:
                key = (device.device_class.value, device.backend, device.vendor_name)
                kinds.setdefault(key, []).append(index)
        pinned = np.zeros(len(self.devices), bool)
        if kinds:
            fastest = min(kinds.values(), key=lambda members: float(unit[members].min()))
            pinned[fastest] = True
        self._baselines.pinned[costs.key] = (costs, pinned)
        return pinned

    def _host_floor(self, tables: StageTables, backlog: np.ndarray) -> np.ndarray:
        """Per host, the least estimate before transfer over its devices (eligible or not, one
        item), brought up to date (with each device's, ``tables.local``) for the hosts whose
        devices moved since the last call."""
        members = self.fleet.host_members
        floor = tables.host_floor
        if floor is None or tables.local is None:
            local = self._before_transfer(backlog, tables.load_now, tables.next_compute)
            tables.local = local
            tables.moved.clear()
            least: np.ndarray = local[members].min(axis=1)
            tables.host_floor = least
            return least
        if not tables.moved:
            return floor
        host_of = self.fleet.host_list
        moved = list({host_of[index] for index in tables.moved})
        tables.moved.clear()
        hosts = members[moved]
        local = self._before_transfer(
            backlog[hosts], tables.load_now[hosts], tables.next_compute[hosts]
        )
        tables.local[hosts] = local
        floor[moved] = local.min(axis=1)
        return floor

    def _transfer_floor(self, task: StageTask, tables: StageTables) -> tuple[float, set[int]]:
        """A floor under :meth:`_transfer` on every device outside the returned hosts (those
        an input's device reaches other than over the network: its own, its direct links'),
        which the bounded search costs exactly instead."""
        fleet = self.fleet
        if not task.inputs:
            return tables.costs.hint.input_bytes * task.items * fleet.ingress_least, set()
        if self.outputs_on_host:
            return sum(h.size_bytes for h in task.inputs) * fleet.ingress_least, set()
        total: float | None = None
        near: set[int] = set()
        for handle in task.inputs:
            src = fleet.index.get(handle.device_id)
            if src is None:
                cost = handle.size_bytes * fleet.ingress_least
            else:
                latency, inverse_bandwidth, hosts = fleet.remote_floor(src)
                cost = latency + handle.size_bytes * inverse_bandwidth
                near |= hosts
            total = cost if total is None else total + cost
        assert total is not None
        return total, near

    def _transfer_at(
        self, task: StageTask, tables: StageTables, at: np.ndarray, hosts: list[int] | None = None
    ) -> np.ndarray:
        """:meth:`_transfer` on the devices ``at`` only: the same figures, entry by entry."""
        fleet = self.fleet
        ingress: np.ndarray = fleet.ingress_inverse_bandwidth[at]
        if not task.inputs:
            size = tables.costs.hint.input_bytes * task.items
            scaled: np.ndarray = size * ingress
            return scaled
        if self.outputs_on_host:
            hosted: np.ndarray = sum(h.size_bytes for h in task.inputs) * ingress
            return hosted
        total: np.ndarray | None = None
        for handle in task.inputs:
            src = fleet.index.get(handle.device_id)
            if src is None:
                cost = handle.size_bytes * ingress
            else:
                latency, inverse_bandwidth = fleet.routes_to(src, at, hosts)
                cost = latency + handle.size_bytes * inverse_bandwidth
            if total is None:
                total = cost
            else:
                total += cost
        assert total is not None
        return total

    def _choose_bounded(
        self, task: StageTask, tables: StageTables, mask: np.ndarray, backlog: np.ndarray
    ) -> tuple[int, dict[str, float]] | None:
        """The full scan's choice (the least estimate, the lowest index among equals), found
        by branch and bound over hosts: each host's floor is its least estimate before
        transfer plus a floor under the transfer there, both sums of terms no larger than the
        full scan's (rounding is monotone), so no device costs less than its host's floor.
        The host with the lowest floor is costed first; then every other host whose floor
        does not exceed the best estimate found. None: nothing eligible was found there (the
        caller scans the fleet, so the answer is the full scan's either way)."""
        members = self.fleet.host_members
        w_t = self.weights.transfer
        floor = self._host_floor(tables, backlog)
        transfer_floor, near = self._transfer_floor(task, tables)
        hosts = [*near, int(np.argmin(floor))]
        at = members[hosts].ravel()
        total, transfer = self._estimate_at(task, tables, mask, backlog, at, hosts)
        best = total.min()
        if best == np.inf:
            return None
        bound = floor + (transfer_floor if self._unit_weights else w_t * transfer_floor)
        bound[hosts] = np.inf  # costed already
        more = np.flatnonzero(bound <= best)
        if more.size:
            extra = members[more].ravel()
            more_total, more_transfer = self._estimate_at(
                task, tables, mask, backlog, extra, more.tolist()
            )
            at = np.concatenate([at, extra])
            total = np.concatenate([total, more_total])
            transfer = np.concatenate([transfer, more_transfer])
            best = total.min()
        position = int(np.argmin(total))
        if len(hosts) > 1 or more.size:  # equal estimates: the lowest index, as the full scan
            ties = np.flatnonzero(total == best)
            position = int(ties[np.argmin(at[ties])])
        index = int(at[position])
        compute = tables.next_compute[index]
        terms = {
            "queue": float(backlog[index]),
            "load": float(tables.load_now[index]),
            "compute": float(compute if task.items == 1 else compute * task.items),
            "transfer": float(transfer[position]),
        }
        return index, terms

    def _estimate_at(
        self,
        task: StageTask,
        tables: StageTables,
        mask: np.ndarray,
        backlog: np.ndarray,
        at: np.ndarray,
        hosts: list[int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The full scan's estimates on the devices ``at`` (infinite where not in ``mask``;
        ``hosts``: they are those hosts' members), and their transfer terms."""
        if task.items == 1 and tables.local is not None:
            local = tables.local[at]  # brought up to date by _host_floor this decision
        else:
            compute = tables.next_compute[at] * task.items
            local = self._before_transfer(backlog[at], tables.load_now[at], compute)
        transfer = self._transfer_at(task, tables, at, hosts)
        total = np.where(mask[at], self._with_transfer(local, transfer), np.inf)
        return total, transfer

    def _eligible(
        self, task: StageTask, costs: StageCosts, now: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Devices that may take ``task`` now (runnable, healthy, where its locality requires,
        breaker not open, not failed by it), and the breaker-blocked ones."""
        base = self._base_masks.get(costs.key)
        if base is None:
            base = costs.runnable & self.healthy
            if self._required[task.stage]:
                base &= self._local[task.stage]
            self._base_masks[costs.key] = base
        if self._not_closed[task.stage]:
            blocked = self._refresh_breakers(task.stage, now)
            mask = base & ~blocked
        else:
            blocked = self._breaker_blocked[task.stage]
            mask = base.copy()
        for device_id in task.excluded:
            index = self.fleet.index.get(device_id)
            if index is not None:
                mask[index] = False
        return mask, blocked

    def _why_not(self, task: StageTask, costs: StageCosts, blocked: np.ndarray) -> dict[str, str]:
        reasons = {}
        for index, device in enumerate(self.devices):
            misplaced = self._misplaced[task.stage][index]
            if costs.why_not[index]:
                reasons[device.id] = costs.why_not[index]
            elif misplaced and self._required[task.stage]:
                reasons[device.id] = misplaced
            elif not self.healthy[index]:
                reasons[device.id] = "unhealthy"
            elif blocked[index]:
                reasons[device.id] = "circuit breaker open"
            elif device.id in task.excluded:
                failure = task.failures.get(device.id, "")
                reasons[device.id] = (
                    f"failed this request ({failure})" if failure else "failed this request"
                )
        return reasons
