"""Warm-up: prepare and set up each plugin stage, time it on every device that can run it
(calibration, :mod:`.probing`), tell the scheduler what it costs there, and load it where it
runs best."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from hetero.framework.engine.calibration import CalibrationStore
from hetero.framework.engine.probing import ProbingMixin
from hetero.framework.engine.status import Progress, describe_failure
from hetero.framework.errors import NoEligibleDeviceError
from hetero.framework.graph import GraphFormat
from hetero.framework.stage_plugin import combined_hint

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = ["WarmUp"]

logger = logging.getLogger(__name__)


class WarmUp(ProbingMixin):
    """Brings the engine's plugin stages up, one after another."""

    def __init__(self, engine: Engine, calibrations: CalibrationStore | None = None) -> None:
        self.engine = engine
        self.calibrations = calibrations or CalibrationStore()

    def run(
        self,
        stages: list[str] | None = None,
        progress: Progress | None = None,
        *,
        stop: threading.Event | None = None,
    ) -> dict[str, str]:
        """Prepare, set up, calibrate and place every plugin stage (or ``stages``), one after
        another; a stage that fails is recorded (``status[stage].reason``) and skipped.
        Returns the failures by stage."""
        report = progress or (lambda stage, message: None)
        failed: dict[str, str] = {}
        for stage in stages if stages is not None else list(self.engine.plugins):
            if self.engine._stopping or (stop is not None and stop.is_set()):
                break
            status = self.engine.status[stage]
            if status.state == "ready":
                continue
            status.state = "loading"
            report(stage, "loading")
            try:
                where = self._warm_stage(stage, report)
            except Exception as err:
                status.state, status.reason = "failed", describe_failure(err)
                failed[stage] = status.reason
                logger.error("stage %s failed to load: %s", stage, status.reason)
                report(stage, f"failed: {status.reason}")
                continue
            status.state = "ready"
            report(stage, f"ready on {where}")
        return failed

    def _warm_stage(self, stage: str, report: Progress) -> str:
        timings = self.engine.status[stage].timings
        for device_id in [d for d, t in timings.items() if isinstance(t, str)]:
            del timings[device_id]  # why a device could not run it: judged afresh below
        plugin = self.engine.plugins[stage]
        plugin.prepare()
        plugin.setup()
        self.set_hints(stage)
        candidates = self.engine.scheduler.runnable_devices(stage)
        if not candidates:
            reasons = self.engine.scheduler.tables[f"{stage}/full"].costs.why_not
            why = {d.id: r for d, r in zip(self.engine.fleet.devices, reasons, strict=True) if r}
            raise NoEligibleDeviceError(stage, why)
        key = f"{stage}/full"
        probe = plugin.probe_payload() if self.engine.probe and len(candidates) > 1 else None
        kept: dict[str, float] = {}
        if probe is not None:
            kept = self._kept(stage, candidates, probe)
            candidates = self._probe(stage, candidates, probe, kept, report)
        best = min(candidates, key=lambda d: self.engine.scheduler.estimate_s(stage, "full", d))
        busy = self._busy_best(stage, candidates, best)
        for device_id in candidates:  # timed devices give their copy back; the best keeps it
            if device_id != best:
                self.engine.models[device_id].evict(key)
        self._preload(stage, best)
        timings = self.engine.status[stage].timings
        if self.engine.probe and best not in timings and self.engine.models[best].resident(key):
            self._seed_pace(stage, best)
            self._relevel(stage, best, kept, probe)
        self._say_idle(stage, best, kept, busy)
        return best

    def _busy_best(self, stage: str, candidates: list[str], best: str) -> str | None:
        """The runtime of ``best``'s cores that placement prefers while other work runs on
        them (:mod:`~hetero.framework.scheduler.core_shares`), when it is not ``best``: the
        first task placed while the cores are busy loads it. None when ``best`` is also the
        leanest, or the shares favour the leanest by no more than the probes' spread."""
        scheduler = self.engine.scheduler
        mates = [d for d in candidates if scheduler.shares_compute(d, best)]
        if len(mates) < 2:
            return None
        with self.engine._lock:
            leanest = min(mates, key=lambda d: scheduler.busy_estimate_s(stage, "full", d))
            if leanest == best or not scheduler.shares_move(stage, best, leanest):
                return None
        logger.info(
            "stage %s: %s takes it while other work runs on its cores (loaded by the first "
            "such task): %.1f ms an item alone against %.1f ms on %s, but it keeps %.0f %% "
            "of the cores busy against %.0f %%",
            stage,
            leanest,
            scheduler.estimate_s(stage, "full", leanest) * 1e3,
            scheduler.estimate_s(stage, "full", best) * 1e3,
            best,
            100 * (scheduler.core_share_of(stage, leanest) or 1.0),
            100 * (scheduler.core_share_of(stage, best) or 1.0),
        )
        return leanest

    def _say_idle(
        self, stage: str, best: str, kept: dict[str, float], busy: str | None = None
    ) -> None:
        """Log and record (``status.idle``) why each other device that can run ``stage``
        was left without it: what placement estimates there against ``best``, or why it
        could not run it."""
        status = self.engine.status[stage]
        status.idle.clear()  # a warm-up again (a reload, a device back) judges afresh
        scheduler = self.engine.scheduler
        chosen_s = scheduler.estimate_s(stage, "full", best)
        for device_id in scheduler.runnable_devices(stage):
            if device_id in (best, busy):  # busy: it runs the stage while the cores are busy
                continue
            estimate_s = scheduler.estimate_s(stage, "full", device_id)
            source = "kept from an earlier start" if device_id in kept else "timed at warm-up"
            spread = max(scheduler.spread_of(stage, best), scheduler.spread_of(stage, device_id))
            untold = (
                f"; within the probes' own spread ({spread:.2f}x), so service may try it "
                f"against {best}, under load"
                if estimate_s < spread * chosen_s
                else ""
            )
            status.idle[device_id] = (
                f"slower: {estimate_s * 1e3:.1f} ms an item against {chosen_s * 1e3:.1f} ms "
                f"on {best} ({source}); runtimes of one compute resource share it, so the "
                f"faster one takes all its work{untold}"
                if scheduler.shares_compute(device_id, best)
                else f"slower: {estimate_s * 1e3:.1f} ms an item against "
                f"{chosen_s * 1e3:.1f} ms on {best} ({source}); loaded when placement sends "
                f"it work"
            )
            if device_id in kept:
                status.timings.setdefault(device_id, kept[device_id])
        for device_id, why in status.timings.items():
            if isinstance(why, str):
                status.idle[device_id] = why
        for device_id, why in status.idle.items():
            logger.info("stage %s: %s left idle: %s", stage, device_id, why)

    def set_hints(self, stage: str) -> None:
        """Cost ``stage`` by its plugin's graphs (the one source of its numbers), and
        recompute where it can run."""
        plugin = self.engine.plugins[stage]
        formats = plugin.formats or (GraphFormat.ONNX,)
        for variant in self.engine.policy.spec.stages[stage].variants:
            hint = combined_hint(plugin.graphs(str(variant), formats[0]))
            with self.engine._lock:
                self.engine.scheduler.set_hint(stage, str(variant), hint)
        for device in self.engine.fleet.devices:
            self._fit_device(stage, device.id)

    def _fit_device(self, stage: str, device_id: str) -> None:
        """Tell the scheduler how ``stage`` runs on ``device_id`` when that differs from its
        hint: runs at once (an engine with continuous batching) and the memory its graphs in
        that device's format hold (an engine's KV cache)."""
        graph_format = self.engine.format_for(stage, device_id)
        plugin = self.engine.plugins[stage]
        if graph_format is None or not plugin.formats:
            return
        backend = self.engine.backends[self.engine._device_by_id[device_id].backend]
        slots = backend.run_slots(device_id, graph_format)
        resident = None
        if graph_format is not plugin.formats[0]:
            resident = combined_hint(plugin.graphs("full", graph_format)).resident_bytes
        if slots != 1 or resident is not None:
            with self.engine._lock:
                self.engine.scheduler.set_device_fit(
                    stage, device_id, slots=slots, resident_bytes=resident
                )

    def _preload(self, stage: str, device_id: str) -> None:
        """Make ``stage`` resident on ``device_id`` if its memory allows (a warm start never
        evicts); otherwise the first request loads it."""
        key = f"{stage}/full"
        with self.engine._lock:
            fits = self.engine.scheduler.preload(device_id, key)
        if not fits:
            logger.info("stage %s: not preloaded on %s (memory budget)", stage, device_id)
            self.engine.models[device_id].evict(key)
            return
        graph_format = self.engine.format_for(stage, device_id)
        assert graph_format is not None
        started = time.perf_counter()
        self.engine.models[device_id].load(
            self.engine.plugins[stage], key, graph_format, self.engine._threads.get(stage, 0)
        )
        load_s = time.perf_counter() - started
        with self.engine._lock:
            self.engine.scheduler.load_measured(key, device_id, load_s)
        self.engine.metrics.loads.labels(stage, device_id).inc()
