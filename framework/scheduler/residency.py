"""Residency glue between placement and the per-device memory managers: finding a device with
room (minimum residency, then young replicas, then draining busy models for an overdue task),
memory-even placement of KV-cache models, KV reservations, warm starts, predictive loads and
releases."""

from __future__ import annotations

import numpy as np

from hetero.framework.scheduler.memory import LoadPlan
from hetero.framework.scheduler.placement import PlacementMixin
from hetero.framework.scheduler.tables import StageTables
from hetero.framework.scheduler.tasks import StageTask

__all__ = ["FAST_ENOUGH", "ResidencyMixin"]

_NONE: frozenset[str] = frozenset()

FAST_ENOUGH = 1.5
"""With LLMs batching continuously, another stage's task is spread over the devices at most
this many times slower for it than the fastest candidate."""


class ResidencyMixin(PlacementMixin):
    """Where a model can be made resident, and the memory moves the scheduler makes itself."""

    def kv_bytes(self, task: StageTask, tables: StageTables) -> int:
        """The KV cache ``task`` holds at its longest, in whole blocks of the paged allocator
        (its last block partly empty: the internal fragmentation a block size costs)."""
        per_token = tables.costs.hint.kv_bytes_per_token
        if not task.kv_tokens or not per_token:
            return 0
        block = self.kv_block_tokens
        blocks = -(-task.kv_tokens // block)
        return int(blocks * block * per_token)

    def _find_room(
        self, task: StageTask, tables: StageTables, mask: np.ndarray, now: float, kv_bytes: int
    ) -> tuple[int, dict[str, float], LoadPlan] | None:
        """The best device that can make the model resident, and how.

        Minimum residency stops thrash, but must not starve a model with no replica free to
        take the task (none at all, or every one at its batch limit): then a second pass may
        evict young idle models that have another replica elsewhere (never the last copy of a
        model, which would only move the thrash). With LLMs batching continuously the spread
        (:meth:`_continuous_spread`) narrows the candidates first; the others are tried when
        none of those has room, before an overdue task drains a device. ``kv_bytes``: the
        task's :meth:`kv_bytes`.
        """
        overdue = self._bounded and now >= self.overdue_at(task)  # self.overdue(task, now)
        wide = mask
        spread = bool(self._kv_keys) and self.placement == "cost_model" and self._continuous_llm()
        if spread:  # the spread narrows the candidates; the rest stay a fallback
            mask = self._continuous_spread(task, tables, mask, kv_bytes, now)
        found = self._room_in(task, tables, mask, now, kv_bytes, overdue)
        if found is None and mask is not wide:
            found = self._room_in(task, tables, wide, now, kv_bytes, overdue)
        if found is not None:
            if spread:
                self._last_placed(tables.costs.key if kv_bytes else tables.costs.stage)[
                    found[0]
                ] = now
                self._timed(task, found[0], now)
            return found
        if overdue:
            self._start_drain(task, tables, wide, now, kv_bytes)
        return None

    def _room_in(
        self,
        task: StageTask,
        tables: StageTables,
        mask: np.ndarray,
        now: float,
        kv_bytes: int,
        overdue: bool,
    ) -> tuple[int, dict[str, float], LoadPlan] | None:
        """:meth:`_find_room` over the devices of ``mask``: the first pass keeps young
        models, the second (only when no candidate holds the model) may evict a young one
        that has a replica elsewhere."""
        costs = tables.costs
        allow_young = _NONE
        for second_pass in (False, True):
            if second_pass:
                if np.count_nonzero(tables.resident & mask):
                    break
                allow_young = frozenset(k for k, t in self.tables.items() if t.resident.sum() >= 2)
            candidates = mask  # copied before the first device is struck off
            while (chosen := self._choose(task, tables, candidates)) is not None:
                index, terms = chosen
                plan = self.memory[index].plan(
                    costs.key,
                    int(tables.resident_bytes[index]),
                    now,
                    allow_young=allow_young,
                    overdue=overdue,
                    kv_bytes=kv_bytes,
                )
                if plan is not None:
                    return index, terms, plan
                if candidates is mask:
                    candidates = mask.copy()
                candidates[index] = False
        return None

    def _index_kv_tables(self) -> None:
        """Note which models have a KV cache (called whenever a table is made or replaced):
        placement spreads only when one does, and only those tables are scanned for work."""
        self._kv_keys = tuple(
            key for key, tables in self.tables.items() if tables.costs.hint.kv_bytes_per_token
        )

    def _continuous_llm(self) -> bool:
        return self.policy.spec.scheduler.batching.llm == "continuous"

    def _backlog_share(self, tables: StageTables, index: int, estimate: float) -> float:
        """What a task placed on device ``index`` adds to the work that later tasks there
        wait behind: its estimate over the device's run slots, except for a sequence of a
        continuously batched model, which adds nothing. It joins the running batch at the
        next step and decodes beside the others; what waits for it is one prefill step, which
        the pacing rule spreads (:meth:`_continuous_spread`). Counting its whole decode made
        the backlog of an LLM device seconds long while a task placed there waited
        milliseconds, and the queue term outweighed every other term of the estimate."""
        if tables.costs.hint.kv_bytes_per_token and self._continuous_llm():
            return 0.0
        return estimate / float(tables.slots[index])

    def _continuous_spread(
        self, task: StageTask, tables: StageTables, mask: np.ndarray, kv_bytes: int, now: float
    ) -> np.ndarray:
        """Candidates for a task when LLMs batch continuously (docs/scheduler.md): a KV-cache
        model's task whose output length is known goes where it adds the least completion
        time (:meth:`_soonest_done`); one whose length is not goes to the devices not given a
        sequence of it within one prefill's compute time (paced), of those memory-evenly and,
        of those, to the ones given a sequence least recently; another model's task, on
        devices a continuous batch is running on, goes to the fast devices with the fewest
        tasks in flight and, of those, to the ones given a task of its stage least recently."""
        if kv_bytes and task.output_tokens:
            return self._soonest_done(task, tables, mask, kv_bytes)
        if kv_bytes:
            placed = self._last_placed(tables.costs.key)
            # Only onto devices that take it without evicting (resident, or a replica in free
            # memory): pacing saves a prefill's stall, never worth another model's eviction.
            pace = self._kv_pace_s(tables)
            paced = self._without_eviction(tables, mask) & (placed <= now - pace)
            if np.count_nonzero(paced):
                mask = paced
            even = self._memory_even(tables, mask, kv_bytes)
            last = np.where(even, placed, np.inf)
            earliest: np.ndarray = even & (last <= last.min())
            return earliest
        return self._fewest_in_flight(tables, mask)

    def _soonest_done(
        self, task: StageTask, tables: StageTables, mask: np.ndarray, kv_bytes: int
    ) -> np.ndarray:
        """A sequence whose output length is known goes where it adds the least completion
        time at that length (:meth:`sequence_cost_s` plus its input's transfer), of the
        candidates that take it without evicting where there are any and, once the stage's
        long length is known (:meth:`OutputLengths.long`), that are fast enough should it
        turn out long (:meth:`_fast_enough_if_long`); of equals, the one given a sequence of
        the model least recently. Its completion at the expected length is kept for
        :meth:`_timed`."""
        room = self._without_eviction(tables, mask)
        if np.count_nonzero(room):
            mask = room
        elif not np.count_nonzero(mask):
            return mask
        transfer = self._transfer(task, tables)
        indices, own, others = self._sequence_terms(task, tables, mask, kv_bytes)
        cost = np.full(len(self.devices), np.inf)
        cost[indices] = own + others + transfer[indices]
        self._predicted = (task.id, indices, own + transfer[indices])
        long = self.output_lengths.long(task.stage)
        if long > task.output_tokens:
            mask = mask & self._fast_enough_if_long(task, tables, indices, kv_bytes, long, transfer)
        least = np.where(mask, cost, np.inf)
        soonest = mask & (least <= least.min())
        last = np.where(soonest, self._last_placed(tables.costs.key), np.inf)
        earliest: np.ndarray = soonest & (last <= last.min())
        return earliest

    def _fast_enough_if_long(
        self,
        task: StageTask,
        tables: StageTables,
        indices: np.ndarray,
        kv_bytes: int,
        long: int,
        transfer: np.ndarray,
    ) -> np.ndarray:
        """Of the devices ``indices``, those where sequence ``task``, should it generate
        ``long`` tokens, would finish with the device to itself no later than it would on the
        candidate where it finishes soonest as that one is now (its transfer counted on both).
        Any other is slower for a long sequence whatever its load (less memory bandwidth):
        what placing it there saves is the others' time on the busier device, which the
        least added time alone trades for a long one's own, and the sequences that turn out
        long there are the tail (docs/scheduler.md). A device like that candidate, with the
        model resident, passes (alone it beats that one as it is) but for its input's
        transfer, so this narrows the choice between kinds of device, not between devices of
        a kind; and a slower kind takes sequences again once the faster one is loaded enough
        that a long one would finish no sooner there."""
        mask = np.zeros(len(self.devices), bool)
        mask[indices] = True
        _, as_is, _ = self._sequence_terms(task, tables, mask, kv_bytes, long)
        alone = self._alone_s(tables, indices, kv_bytes, long)
        mask[indices] = alone + transfer[indices] <= (as_is + transfer[indices]).min()
        return mask

    def _last_placed(self, name: str) -> np.ndarray:
        """When each device was last given a sequence of KV-cache model ``name`` (a model
        key) or a task of stage ``name`` (another stage's, while LLMs batch continuously)."""
        placed = self._spread_placed_at.get(name)
        count = len(self.devices)
        if placed is None or placed.size != count:
            grown = np.full(count, -np.inf)
            if placed is not None:
                grown[: min(placed.size, count)] = placed[:count]
            placed = self._spread_placed_at[name] = grown
        return placed

    def _kv_pace_s(self, tables: StageTables) -> np.ndarray:
        """Seconds one nominal request of KV-cache model ``tables`` computes on each device at
        its peak (the prompt's prefill dominates it): the pace at which a device is given
        sequences of the model while another candidate has not been given one as recently.
        Sequences placed on one device within a prefill of each other form a burst: their
        prefills stall that device's decode steps back to back, and they grow and leave
        together as a cohort; passing to another candidate spreads both."""
        hint = tables.costs.hint
        kept = self._kv_pace.get(tables.costs.key)
        if kept is not None and kept[0] is hint and kept[1].size == len(self.devices):
            return kept[1]  # made for this hint (set_hint replaces it) and this fleet
        peaks = np.array([d.peak_flops_for(hint.dtype) for d in self.devices], dtype=float)
        pace = np.zeros(peaks.size)
        np.divide(hint.flops_per_item, peaks, out=pace, where=peaks > 0)
        self._kv_pace[tables.costs.key] = (hint, pace)
        return pace

    def _fewest_in_flight(self, tables: StageTables, mask: np.ndarray) -> np.ndarray:
        """A batch of another model on a device running a continuous batch stalls every
        running sequence for its length, so such batches are spread evenly: of the
        candidates where the model is resident or fits without evicting (a replica where
        memory allows) and no more than :data:`FAST_ENOUGH` times slower than the fastest,
        those with the fewest tasks in flight, and of those the ones given a task of this
        stage least recently (the cost model chooses among them); "slower" counts the wait
        for a decode step in progress (:meth:`_step_wait_s`). Without that last step the
        cost model, whose batching discount favours a batch forming, keeps sending a stage's
        tasks to the same device while in-flight counts tie, and the stalls come in bursts
        there. The mask as it is when no continuously batched model has work on a candidate,
        or no candidate has room without evicting."""
        if not mask.any():
            return mask
        busy = np.zeros_like(mask)
        for key in self._kv_keys:
            if key != tables.costs.key:
                busy |= self.tables[key].pending > 0
        if not (busy & mask).any():
            return mask
        room = self._without_eviction(tables, mask)
        if not room.any():
            return mask  # never an eviction for the spread's sake
        unit = tables.unit_s + self._step_wait_s(busy & room)
        fast = room & (unit <= FAST_ENOUGH * unit[room].min())
        in_flight = np.where(fast, self.in_flight, np.iinfo(np.int64).max)
        fewest = fast & (self.in_flight <= in_flight.min())
        last = np.where(fewest, self._last_placed(tables.costs.stage), np.inf)
        earliest: np.ndarray = fewest & (last <= last.min())
        return earliest

    def _without_eviction(self, tables: StageTables, mask: np.ndarray) -> np.ndarray:
        """The candidates where the model is resident or fits in free memory."""
        room: np.ndarray = mask & tables.resident
        for index in np.flatnonzero(mask & ~tables.resident).tolist():
            room[index] = self.memory[index].free >= tables.resident_bytes[index]
        return room

    def _memory_even(self, tables: StageTables, mask: np.ndarray, kv_bytes: int) -> np.ndarray:
        """Memory-balanced placement of a model with a KV cache that batches continuously:
        of the candidates where it is resident or fits in free memory (no eviction), those
        whose memory use after taking the task is within half a request's KV cache of the
        least (ties, in practice); the cost model chooses among them. A continuous batch's
        step time barely grows with its size, so the cost model alone fills one device's
        batch before the next; this spreads the sequences, hence the KV cache, hence memory
        use, evenly (a device with room and without the model draws it there: a replica).
        The mask as it is when no candidate fits without evicting."""
        indices = np.flatnonzero(mask)
        if indices.size < 2:
            return mask
        after = np.empty(indices.size)
        for position, index in enumerate(indices.tolist()):
            manager = self.memory[index]
            loaded = tables.costs.key in manager.resident
            after[position] = (
                manager.used + kv_bytes + (0 if loaded else tables.resident_bytes[index])
            )
        capacity = self.fleet.capacity[indices]
        fits = after <= capacity
        if not fits.any():
            return mask
        share = after / capacity
        least = share[fits].min()
        keep = fits & (share <= least + 0.5 * kv_bytes / capacity)
        even = np.zeros_like(mask)
        even[indices[keep]] = True
        return even

    def overdue(self, task: StageTask, now: float) -> bool:
        """Whether ``task`` has waited its class's ``max_load_wait_s`` in its queue: from then
        on minimum residency no longer protects other models from it."""
        return now >= self.overdue_at(task)

    def overdue_at(self, task: StageTask) -> float:
        """When ``task`` becomes overdue (the same sum as the wake-up time, so a wake-up at
        that instant finds it overdue whatever the rounding)."""
        return task.enqueued_at + self.load_wait_s[task.qos_class]

    def _start_drain(
        self, task: StageTask, tables: StageTables, mask: np.ndarray, now: float, kv_bytes: int
    ) -> None:
        """Busy models hold the room an overdue task needs: on the best device without a drain
        under way, stop feeding the models whose going makes room, so they turn idle within
        the work already promised to them (at most one batch each)."""
        if any(owner == task.id for owner, _ in self._drains.values()):
            return
        candidates = mask.copy()
        for index in self._drains:
            candidates[index] = False
        costs = tables.costs
        while (chosen := self._choose(task, tables, candidates)) is not None:
            index = chosen[0]
            manager = self.memory[index]
            resident = costs.key in manager.resident
            needed = kv_bytes + (0 if resident else costs.hint.resident_bytes)
            victims = manager.drain_victims(needed, now, keep=costs.key)
            if victims is not None:
                self._drains[index] = (task.id, victims)
                for victim in victims:
                    self.tables[victim].draining[index] = True
                self.stats.counts["drains"] += 1
                return
            candidates[index] = False

    def _end_drain(self, index: int) -> None:
        drain = self._drains.pop(index, None)
        if drain is not None:
            for victim in drain[1]:
                self.tables[victim].draining[index] = False
            self._unblock()  # the next overdue task may start its drain at once

    def _release_drains(self, task_id: int) -> None:
        """The task a drain was for left the queue (placed, rejected, cancelled)."""
        for index, (owner, _) in list(self._drains.items()):
            if owner == task_id:
                self._end_drain(index)

    def preload(self, device_id: str, model_key: str) -> bool:
        """Make ``model_key`` resident on ``device_id`` before any work (a warm start). False if
        it does not fit in the free memory: a warm start never evicts."""
        index = self.fleet.index[device_id]
        tables = self.tables[model_key]
        costs = tables.costs
        now = self.clock.now()
        resident_bytes = int(tables.resident_bytes[index])
        plan = self.memory[index].plan(model_key, resident_bytes, now)
        if plan is None or plan.evict:
            return plan is not None and not plan.load
        self.memory[index].apply(
            plan, resident_bytes, float(costs.load_s[index]), now, costs.min_residency_s
        )
        tables.resident[index] = True
        tables.refresh(index)
        return True

    def prefetch(self, model_key: str, evictable: frozenset[str]) -> tuple[str, LoadPlan] | None:
        """Load ``model_key`` ahead of its traffic (predictive warm-up) on the device where it
        loads fastest and room can be made by evicting idle models named in ``evictable`` (even
        young ones: the forecaster judged them colder). None when no device has such room or
        it is already resident somewhere. The caller carries out the plan (the load takes its
        time on the device)."""
        tables = self.tables[model_key]
        costs = tables.costs
        if tables.resident.any():
            return None
        now = self.clock.now()
        runnable = np.flatnonzero(costs.runnable & self.healthy)
        for index in sorted(runnable.tolist(), key=lambda i: (float(costs.load_s[i]), i)):
            manager = self.memory[index]
            plan = manager.plan(model_key, costs.hint.resident_bytes, now, allow_young=evictable)
            if plan is None or not all(victim in evictable for victim in plan.evict):
                continue
            for victim in plan.evict:
                self.tables[victim].resident[index] = False
                self.tables[victim].refresh(index)
            manager.apply(
                plan,
                costs.hint.resident_bytes,
                float(costs.load_s[index]),
                now,
                costs.min_residency_s,
            )
            tables.resident[index] = True
            tables.refresh(index)
            self.stats.counts["loads"] += 1
            self.stats.counts["prefetches"] += 1
            self.stats.counts["evictions"] += len(plan.evict)
            return self.devices[index].id, plan
        return None

    def release(self, device_id: str, model_key: str) -> bool:
        """Evict an idle ``model_key`` from ``device_id`` (its traffic is forecast to have
        ended); False if it is not resident there or has work in flight."""
        index = self.fleet.index[device_id]
        manager = self.memory[index]
        residency = manager.resident.get(model_key)
        if residency is None or residency.in_flight:
            return False
        now = self.clock.now()
        manager.apply(LoadPlan(key=model_key, load=False, evict=(model_key,)), 0, 0.0, now, 0.0)
        self.tables[model_key].resident[index] = False
        self.tables[model_key].refresh(index)
        self.stats.counts["evictions"] += 1
        self.stats.counts["releases"] += 1
        self._unblock()
        return True

    def unloaded(self, device_id: str, model_key: str) -> None:
        """The engine dropped a model on its own (a failed load): forget its residency."""
        index = self.fleet.index[device_id]
        self.memory[index].resident.pop(model_key, None)
        self.tables[model_key].resident[index] = False
        self.tables[model_key].refresh(index)
