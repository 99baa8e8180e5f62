"""Calibration at warm-up: what a stage's probe takes on each device that can run it, timed
side by side or kept from an earlier start (:mod:`.calibration`), told to the scheduler and to
admission's pace, and kept for the next start (:class:`ProbingMixin`, part of
:class:`~hetero.framework.engine.warmup.WarmUp`)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from hetero.framework.engine.calibration import CalibrationKey, CalibrationStore
from hetero.framework.engine.share_probes import narrow_share, process_share
from hetero.framework.engine.status import Progress, describe_failure

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = [
    "CORE_SHARE_ITEMS",
    "EXTRA_PROBE_RUNS",
    "LOAD_ITEMS",
    "PROBE_RUNS",
    "SPREAD_ITEMS",
    "ProbingMixin",
]

logger = logging.getLogger(__name__)
PROBE_RUNS = 3
# At most this many more timed runs of the two fastest candidates when the first rounds cannot
# tell them apart (WarmUp._separate; bounded by time too).
EXTRA_PROBE_RUNS = 12
# The calibration key's size for a model's load time on a device (a probe has at least one).
LOAD_ITEMS = 0.0
# The calibration key's size for the spread of a probe's timed runs (slowest over fastest).
SPREAD_ITEMS = -1.0
# The calibration key's size for the share of the host's cores a probe kept busy (-2.0 until
# 2026-12-07: process CPU time over a run alone; -3.0 in the eleventh session: a narrow copy's
# run alone; neither read any more).
CORE_SHARE_ITEMS = -4.0


class ProbingMixin:
    """Warm-up's timing of each stage's probe and the figures kept between starts; the
    engine and the store are :class:`~hetero.framework.engine.warmup.WarmUp`'s."""

    engine: Engine
    calibrations: CalibrationStore

    if TYPE_CHECKING:

        def set_hints(self, stage: str) -> None:
            """:meth:`~hetero.framework.engine.warmup.WarmUp.set_hints`: placement leaves
            out the devices that could not run the probe."""

    def _relevel(self, stage: str, best: str, kept: dict[str, float], probe: Any) -> None:
        """``best`` was timed again now (admission's pace) while the others kept an earlier
        start's figures: move those that share its compute by the same factor, so the
        ranking stays the one measured side by side and only the level is today's (a busier
        machine today must not make the idle runtimes look faster)."""
        now = self.engine.status[stage].timings.get(best)
        if best not in kept or not isinstance(now, float) or probe is None:
            return
        factor = now / kept[best]
        items = self.engine.plugins[stage].items(probe)
        scheduler = self.engine.scheduler
        timings = self.engine.status[stage].timings
        with self.engine._lock:
            for device_id, seconds in kept.items():
                if device_id != best and scheduler.shares_compute(device_id, best):
                    scheduler.calibrate(stage, device_id, seconds * factor, items)
                    timings[device_id] = seconds * factor  # what placement now believes

    def _probe(
        self,
        stage: str,
        candidates: list[str],
        probe: Any,
        kept: dict[str, float],
        report: Progress,
    ) -> list[str]:
        """Time ``probe`` on every candidate without a kept figure; the candidates that could
        run it (the others are left out of placement, with why).

        Each candidate is loaded and runs the probe once untimed (lazy initialisation); then
        the timed runs go round the candidates in turn, and each keeps its best: the runtimes
        are measured side by side, so a burst of other work on the machine falls on all of
        them alike instead of on whichever was being timed."""
        timings = self.engine.status[stage].timings
        errors: dict[str, Exception] = {}
        todo = [d for d in candidates if d not in kept]
        for device_id in todo:
            report(stage, f"loading on {device_id}")
            try:
                self._run_once(stage, device_id, probe)
            except Exception as err:
                self._unavailable(stage, device_id, err, errors)
        samples: dict[str, list[float]] = {}
        busy: dict[str, list[float]] = {}  # process CPU time over wall time, per run
        for _ in range(PROBE_RUNS):
            for device_id in todo:
                if device_id in errors:
                    continue
                report(stage, f"timing on {device_id}")
                try:
                    self._timed_run(stage, device_id, probe, samples, busy)
                except Exception as err:
                    self._unavailable(stage, device_id, err, errors)
        self._separate(stage, probe, samples, busy, errors, report)
        for device_id, runs in samples.items():
            if device_id not in errors:
                timings[device_id] = seconds = min(runs)
                self._record(stage, device_id, probe, seconds)
                self._keep(stage, device_id, probe, seconds)
                if seconds > 0:  # how far apart its runs were: what a probe cannot tell apart
                    spread = max(runs[:PROBE_RUNS]) / min(runs[:PROBE_RUNS])
                    self._spread(stage, device_id, probe, spread, keep=True)
                share = narrow_share(self.engine, stage, device_id, probe, seconds)
                if share is None:
                    share = self._core_share(device_id, busy.get(device_id, []))
                if share is not None:
                    self._share(stage, device_id, probe, share, keep=True)
        if errors:  # placement leaves out the devices that could not run it
            self.set_hints(stage)
        measured = [d for d in candidates if d not in errors]
        if not measured:
            causes = {describe_failure(err) for err in errors.values()}
            if len(causes) == 1:  # the same cause everywhere: that is the reason
                raise next(iter(errors.values()))
            raise RuntimeError("; ".join(f"{d}: {timings[d]}" for d in candidates))
        return measured

    def _separate(
        self,
        stage: str,
        probe: Any,
        samples: dict[str, list[float]],
        busy: dict[str, list[float]],
        errors: dict[str, Exception],
        report: Progress,
    ) -> None:
        """The two fastest candidates again, in turn, while the runner-up's fastest run lies
        within the fastest one's runs (the rounds so far cannot tell them apart), for at most
        as long again as those rounds took: a best of more runs ranks runtimes a few percent
        apart by their speed rather than by which of them a burst of other work hit."""
        timed = {d: runs for d, runs in samples.items() if d not in errors and runs}
        if len(timed) < 2:
            return
        first, second = sorted(timed, key=lambda d: min(timed[d]))[:2]
        budget = sum(sum(runs) for runs in timed.values())
        spent = 0.0
        for _ in range(EXTRA_PROBE_RUNS):
            if min(timed[second]) > max(timed[first]) or spent >= budget:
                return
            for device_id in (first, second):
                report(stage, f"timing on {device_id} again (within the other's spread)")
                try:
                    spent += self._timed_run(stage, device_id, probe, samples, busy)
                except Exception as err:
                    self._unavailable(stage, device_id, err, errors)
                    return

    def _timed_run(
        self,
        stage: str,
        device_id: str,
        probe: Any,
        samples: dict[str, list[float]],
        busy: dict[str, list[float]],
    ) -> float:
        """One timed probe run on ``device_id``: its wall time into ``samples`` and the cores
        it kept busy (process CPU time over wall time) into ``busy``; the wall time."""
        cpu_before = time.process_time()
        seconds = self._run_once(stage, device_id, probe)
        samples.setdefault(device_id, []).append(seconds)
        if seconds > 0:
            busy.setdefault(device_id, []).append((time.process_time() - cpu_before) / seconds)
        return seconds

    def _key(
        self, stage: str, device_id: str, probe: Any, items: float | None = None
    ) -> CalibrationKey | None:
        """The calibration key of ``probe`` on ``device_id``, of the model's load there
        (``items`` :data:`LOAD_ITEMS`) or of the probe's spread (:data:`SPREAD_ITEMS`); None:
        the stage names no model version, so nothing says two starts run the same model."""
        version = self.engine.policy.spec.stages[stage].model_version
        graph_format = self.engine.format_for(stage, device_id)
        if not version or graph_format is None:
            return None
        return CalibrationKey.of(
            str(version),
            graph_format.value,
            self.engine._device_by_id[device_id],
            self.engine._threads.get(stage, 0),
            self.engine.plugins[stage].items(probe) if items is None else items,
            self.engine.plugins[stage],
        )

    def _kept(self, stage: str, candidates: list[str], probe: Any) -> dict[str, float]:
        """Kept figures of earlier starts for the candidates, given to the scheduler as a
        probe's would be: a candidate with one is not loaded to be timed."""
        kept: dict[str, float] = {}
        items = self.engine.plugins[stage].items(probe)
        for device_id in candidates:
            seconds = self._kept_figure(stage, device_id, probe)
            if seconds is not None:
                kept[device_id] = seconds
                with self.engine._lock:
                    self.engine.scheduler.calibrate(stage, device_id, seconds, items)
            spread = self._kept_figure(stage, device_id, probe, SPREAD_ITEMS)
            if spread is not None:
                self._spread(stage, device_id, probe, spread, keep=False)
            share = self._kept_figure(stage, device_id, probe, CORE_SHARE_ITEMS)
            if share is not None:
                self._share(stage, device_id, probe, share, keep=False)
            load_s = self._kept_figure(stage, device_id, probe, LOAD_ITEMS)
            if load_s is not None:  # what loading it there took, when it was last loaded
                with self.engine._lock:
                    self.engine.scheduler.load_measured(f"{stage}/full", device_id, load_s)
        return kept

    def _kept_figure(
        self, stage: str, device_id: str, probe: Any, items: float | None = None
    ) -> float | None:
        """An earlier start's figure under :meth:`_key` (None: none kept, or no key)."""
        key = self._key(stage, device_id, probe, items)
        return self.calibrations.get(key) if key is not None else None

    def _spread(self, stage: str, device_id: str, probe: Any, spread: float, *, keep: bool) -> None:
        """Tell the scheduler how far apart the probe's timed runs on ``device_id`` were
        (slowest over fastest), and keep the figure with the timing (``keep``)."""
        with self.engine._lock:
            self.engine.scheduler.probe_spread(stage, device_id, spread)
        key = self._key(stage, device_id, probe, SPREAD_ITEMS) if keep else None
        if key is not None:
            self.calibrations.put(key, spread)

    def _core_share(self, device_id: str, cores_busy: list[float]) -> float | None:
        """:func:`~.share_probes.process_share` of ``device_id``'s probe runs."""
        return process_share(self.engine._device_by_id[device_id], cores_busy)

    def _share(self, stage: str, device_id: str, probe: Any, share: float, *, keep: bool) -> None:
        """Tell the scheduler the share of the host's cores the probe on ``device_id`` kept
        busy, and keep the figure with the timing (``keep``)."""
        with self.engine._lock:
            self.engine.scheduler.probe_core_share(stage, device_id, share)
        key = self._key(stage, device_id, probe, CORE_SHARE_ITEMS) if keep else None
        if key is not None:
            self.calibrations.put(key, share)

    def _keep(self, stage: str, device_id: str, probe: Any, seconds: float) -> None:
        key = self._key(stage, device_id, probe)
        if key is not None:
            self.calibrations.put(key, seconds)

    def _seed_pace(self, stage: str, device_id: str) -> None:
        """Time the probe on the one device a stage has, so admission knows its pace before
        the first request (a burst arriving at once is judged, not admitted blind)."""
        probe = self.engine.plugins[stage].probe_payload()
        if probe is None:
            return
        try:
            self.engine.status[stage].timings[device_id] = self._time(stage, device_id, probe)
        except Exception as err:  # the first request will measure it instead
            logger.warning("stage %s: timing on %s failed: %s", stage, device_id, err)

    def _time(self, stage: str, device_id: str, probe: Any) -> float:
        """Load ``stage`` on ``device_id``, run the probe (the first run pays for lazy
        initialisation), and feed the best of the timed runs to the cost model."""
        self._run_once(stage, device_id, probe)
        seconds = min(self._run_once(stage, device_id, probe) for _ in range(PROBE_RUNS))
        self._record(stage, device_id, probe, seconds)
        return seconds

    def _run_once(self, stage: str, device_id: str, probe: Any) -> float:
        """One run of ``probe`` on ``device_id`` (loading the stage there first if needed):
        its run time, timed where it ran, as the lanes time batches."""
        plugin = self.engine.plugins[stage]
        graph_format = self.engine.format_for(stage, device_id)
        assert graph_format is not None
        host, threads = self.engine.models[device_id], self.engine._threads.get(stage, 0)
        ran = host.run_batch(plugin, f"{stage}/full", graph_format, threads, [probe])
        if ran.load_s > 0:  # it loaded first: the scheduler's load estimate there, kept
            with self.engine._lock:
                self.engine.scheduler.load_measured(f"{stage}/full", device_id, ran.load_s)
            key = self._key(stage, device_id, probe, LOAD_ITEMS)
            if key is not None:
                self.calibrations.put(key, ran.load_s)
        (result,) = ran.results
        if isinstance(result, BaseException):
            raise result
        return ran.run_s

    def _record(self, stage: str, device_id: str, probe: Any, seconds: float) -> None:
        """Give a probe's best time to the cost model and to admission's pace."""
        plugin = self.engine.plugins[stage]
        units = self.engine.admitter.units(self.engine.admitter.profile(stage, probe))
        with self.engine._lock:
            self.engine.scheduler.calibrate(stage, device_id, seconds, plugin.items(probe))
            self.engine.admission.pace(stage).seed(seconds, plugin.items(probe), units)

    def _unavailable(
        self, stage: str, device_id: str, err: Exception, errors: dict[str, Exception]
    ) -> None:
        """``device_id`` could not run ``stage``'s probe: placement leaves it out, with why."""
        errors[device_id] = err
        timings = self.engine.status[stage].timings
        timings[device_id] = f"unavailable: {describe_failure(err)}"
        logger.warning("stage %s: %s unavailable: %s", stage, device_id, err)
        self.engine.models[device_id].evict(f"{stage}/full")
        self.engine._unfit[(stage, device_id)] = str(timings[device_id])
