"""Changes to the fleet and its stages while the scheduler runs (a stage plugin's hint in place
of the policy's figures, a runtime's fit on a device, devices joining, a stage added), and the
per-variant tables, compute groups and search choice that construction sets the same way."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import BandwidthHint
from hetero.framework.locality import locality_mismatch
from hetero.framework.policy import Policy
from hetero.framework.policy.hints import hint_from_variant
from hetero.framework.policy.schema import StageConfig
from hetero.framework.scheduler import placement as placement_module
from hetero.framework.scheduler.costs import FleetCosts, StageCosts
from hetero.framework.scheduler.memory import MemoryManager, share_memory
from hetero.framework.scheduler.queues import QueueClass, StageQueue
from hetero.framework.scheduler.residency import ResidencyMixin
from hetero.framework.scheduler.tables import StageTables, compute_groups
from hetero.framework.topology import Topology

__all__ = ["SEARCHES", "FleetUpdatesMixin"]

SEARCHES = (None, "full", "bounded")


class FleetUpdatesMixin(ResidencyMixin):
    """The stages' tables and the fleet's groups, made at the start and again as they change."""

    def _set_compute_groups(self) -> None:
        """Number each device's compute resource (:func:`compute_groups`)."""
        self._compute_group = compute_groups(self.devices)
        self._groups = int(self._compute_group.max()) + 1 if len(self.devices) else 0
        self._grouped = self._groups < len(self.devices)

    def _fleet_searched(self, search: str | None) -> None:
        """Whether placement searches by branch and bound on this fleet (one host: no)."""
        if search not in SEARCHES:
            raise ValueError(f"unknown search {search!r} (known: full, bounded)")
        self._search = search
        count = len(self.devices)
        large = count >= placement_module.BOUNDED_SEARCH_MIN_DEVICES
        chosen = search == "bounded" or (search is None and large)
        self._bounded_search = chosen and self.placement == "cost_model" and self.fleet.hosts > 1

    def _add_tables(self, name: str, stage: StageConfig, count: int) -> None:
        """Fresh tables for each variant of stage ``name``. A variant without figures in the
        policy costs nothing until the stage plugin's hint arrives with set_hint() (only its
        batch size is known)."""
        for variant_name, variant in stage.variants.items():
            hint = hint_from_variant(variant) or BandwidthHint(
                0.0, 0.0, batchable=variant.batchable, max_batch=variant.max_batch
            )
            costs = self._costs(name, variant_name, hint)
            self.tables[costs.key] = StageTables.fresh(
                costs, count, self._ahead_s(name, variant_name)
            )

    def _ahead_s(self, stage: str, variant: str) -> float | None:
        """The variant's ``dispatch_ahead_ms``, else the policy-wide one, in seconds (None:
        a device takes up to a batch per run slot). None for a variant batched continuously
        (a KV cache under ``batching.llm: continuous``): a task joins the running batch at its
        next step, so nothing waits behind a batch, and a sequence's whole decode would
        exceed any useful bound."""
        spec = self.policy.spec
        variants = spec.stages[stage].variants
        config = variants["light"] if variant == "light" else variants["full"]
        if config.kv_bytes_per_token and spec.scheduler.batching.llm == "continuous":
            return None
        ahead_ms = config.dispatch_ahead_ms
        if ahead_ms is None:
            ahead_ms = spec.scheduler.batching.dispatch_ahead_ms
        return None if ahead_ms is None else ahead_ms / 1000.0

    def _costs(self, stage: str, variant: str, hint: BandwidthHint) -> StageCosts:
        config = self.policy.spec.stages[stage]
        residency = config.min_residency_s
        if residency is None:
            residency = self.policy.spec.scheduler.min_residency_s
        return self.fleet.stage(
            stage, variant, hint, config.device_classes, residency, self._can_run
        )

    def set_hint(self, stage: str, variant: str, hint: BandwidthHint) -> None:
        """Cost ``stage/variant`` by ``hint`` from now on (a stage plugin's graphs are the
        source of its cost); the policy's batch size and delay still bound its batches."""
        key = f"{stage}/{variant}"
        old = self.tables[key]
        policy_batch = old.costs.hint.max_batch
        if hint.batchable:
            hint = dataclasses.replace(hint, max_batch=min(hint.max_batch, policy_batch))
        fresh = StageTables.fresh(
            self._costs(stage, variant, hint), len(self.devices), self._ahead_s(stage, variant)
        )
        fresh.pending[:] = old.pending
        for (measured_key, index), seconds in self._loads.items():
            if measured_key == key:  # a load timed where it ran outlives the hint's guess
                fresh.costs.load_s[index] = seconds
        fresh.correction[:] = old.correction
        fresh.resident[:] = old.resident
        fresh.draining[:] = old.draining
        for index in range(len(self.devices)):
            fit = self._fits.get((stage, index))
            if fit is not None:
                fresh.fit(index, *fit)
            fresh.refresh(index)
        self.tables[key] = fresh
        self._index_kv_tables()
        self._base_masks.clear()

    def set_device_fit(
        self, stage: str, device_id: str, *, slots: int = 1, resident_bytes: int | None = None
    ) -> None:
        """How ``stage`` runs on ``device_id`` when its runtime there differs from the hint:
        ``slots`` batches at once (a vLLM engine's continuous batching: that many tasks may
        be outstanding, and each queues behind the others for a share of its estimate) and
        ``resident_bytes`` held (the engine's KV cache beside its weights), which the memory
        manager plans with. Kept across :meth:`set_hint`."""
        if slots < 1:
            raise ValueError(f"slots must be a positive integer, got {slots}")
        index = self.fleet.index[device_id]
        self._fits[(stage, index)] = (slots, resident_bytes)
        for key, tables in self.tables.items():
            if key.split("/", 1)[0] == stage:
                tables.fit(index, slots, resident_bytes)

    def add_devices(self, devices: Sequence[DeviceSpec], topology: Topology) -> None:
        """Take in devices that joined (a cluster node): they are placed on from now on, with
        nothing resident; what the others hold, their queues and estimates stay as they are.
        ``topology`` is the model of the whole fleet, old devices and new."""
        if not devices:
            return
        old = len(self.devices)
        self.devices = self.devices + tuple(devices)
        count = len(self.devices)
        reserve = self.policy.spec.scheduler.memory_reserve_fraction
        capacity = [int(d.memory_bytes * (1 - reserve)) for d in self.devices]
        self.fleet = FleetCosts(self.devices, topology, capacity)
        eviction = self.memory[0].eviction if self.memory else "cost_aware"
        self.memory.extend(
            MemoryManager(d.id, c, eviction) for d, c in zip(devices, capacity[old:], strict=True)
        )
        share_memory(self.memory, [d.memory_id for d in self.devices])
        for key, tables in list(self.tables.items()):
            stage, variant = key.split("/", 1)
            costs = self._costs(stage, variant, tables.costs.hint)
            grown = StageTables.fresh(costs, count, tables.ahead_s)
            grown.pending[:old] = tables.pending
            grown.correction[:old] = tables.correction
            grown.resident[:old] = tables.resident
            grown.draining[:old] = tables.draining
            for index in range(old):
                fit = self._fits.get((stage, index))
                if fit is not None:
                    grown.fit(index, *fit)
                grown.refresh(index)
            self.tables[key] = grown
        self._index_kv_tables()
        spec = self.policy.spec
        for name, stage_config in spec.stages.items():  # the newcomers' data locality
            reasons = [locality_mismatch(stage_config.locality, d) for d in devices]
            self._misplaced[name] = self._misplaced[name] + reasons
            self._local[name] = np.concatenate(
                [self._local[name], np.array([not reason for reason in reasons], bool)]
            )
        extra = count - old
        self.backlog = np.concatenate([self.backlog, np.zeros(extra)])
        self.in_flight = np.concatenate([self.in_flight, np.zeros(extra, np.int64)])
        self.healthy = np.concatenate([self.healthy, np.ones(extra, bool)])
        self._breaker_blocked = {
            name: np.concatenate([blocked, np.zeros(extra, bool)])
            for name, blocked in self._breaker_blocked.items()
        }
        self._set_compute_groups()
        self._base_masks.clear()
        self._fleet_searched(self._search)
        self._unblock()

    def add_stage(self, name: str, policy: Policy) -> None:
        """Take in a stage that ``policy`` (the running one plus it) adds: a model version
        loaded beside the one serving. It starts costed by its policy figures, with its own
        queue, residency and breakers; nothing else changes."""
        if name in self.queues:
            raise ValueError(f"stage {name!r} is already scheduled")
        self.policy = policy
        spec = policy.spec
        config = spec.stages[name]
        count = len(self.devices)
        self._add_tables(name, config, count)
        self._index_kv_tables()
        classes = {
            n: QueueClass(weight=c.weight, bound=c.queue_bound) for n, c in spec.qos.classes.items()
        }
        queue = StageQueue(name, classes, spec.qos.aging_per_second, self._queued)
        queues = {**self.queues, name: queue}
        self.queues = dict(sorted(queues.items()))  # dispatch breaks ties by this order
        self._misplaced[name] = [locality_mismatch(config.locality, d) for d in self.devices]
        self._local[name] = np.array([not reason for reason in self._misplaced[name]], bool)
        self._required[name] = config.locality is not None and config.locality.mode == "require"
        if config.locality is not None and config.locality.mode == "prefer":
            self._preferred.add(name)
        self._breaker_blocked[name] = np.zeros(count, bool)
        self._not_closed[name] = set()
        self._round_robin[name] = -1
        self._base_masks.clear()
