"""Runtimes of one compute resource compared under the load they run, not only alone.

The scheduler's correction of a device (measured over modelled run time) is learnt from the
batches that ran there. Runtimes that share one compute resource (OpenVINO, ONNX Runtime and
torch over one host's cores) get one batch of a model in flight between them, so in service
only the runtime placement prefers runs the model, and the others' corrections move with its
own by the same factor (``Scheduler._share_correction``): their ranking stays the one warm-up
measured, one probe each, alone. Under load that ranking can be wrong: the batch sizes the load
makes and the other models running beside them on the same cores are not the probe's.

So the runner-up is measured in service, a batch at a time:

- **When.** The preferred runtime's correction moved from its warm-up figure by a factor ``f``
  (either way): the cost model is off by that much there, so a runtime of its group whose
  estimate is within ``f`` of its own may in truth be faster. Likewise a runtime whose
  estimate is within the spread of warm-up's timed runs (slowest over fastest, on either of
  the two: :meth:`~hetero.framework.scheduler.estimates.EstimatesMixin.probe_spread`): the
  probes did not tell the two apart, so which is faster is left to service. Also while the
  preferred runtime is not the one warm-up found fastest: service evidence overrode warm-up's,
  and it goes on being checked (the load that made it may have passed). Otherwise nothing is
  explored: a cost model that holds, between runtimes the probes told apart, costs nothing.
  Where warm-up measured the runtimes' core shares, a trial starts only while the cores run
  nothing else (:mod:`~hetero.framework.scheduler.core_shares`): a trial's wall time is
  the probe's measure, and beside other work it rewards the runtime that takes more cores.
  Its period then counts only batches that ran alone, from the last one that did not: the
  preferred runtime's correction, which the trial is judged against, is learnt from every
  batch, and right after a busy spell it still holds the load's level, against which a
  runner-up timed alone looked faster than it is (on the bench, a stage moved to the
  runtime 6 % slower alone at concurrency 1 after every point at 32).
- **How often.** After every :data:`EXPLORE_EVERY` batches of the model on the group, the next
  batch goes to the runner-up (the best estimate of the group's other runtimes that is loaded
  or fits in free memory: a trial never evicts), of the size the preferred one last ran and at
  least :data:`TRIAL_TASKS` tasks, judged by the median of their measures. At
  most one batch in ``EXPLORE_EVERY + 1`` runs where the estimate says slower, and each trial
  that leaves the runner-up the slower doubles the period (up to :data:`MAX_BACKOFF` times).
  A runner-up that is not loaded first runs one task unmeasured (loading and lazy
  initialisation are not its pace), and its load is paid from the same budget: its load runs
  on the cores the runtimes share, so the trial waits until the preferred runtime has run
  ``EXPLORE_EVERY`` times the load's worth of batches beyond the period (the load as timed
  where it ran, :meth:`~hetero.framework.scheduler.estimates.EstimatesMixin.load_measured`;
  the cost model's guess until then).
- **What it changes.** Nothing, until the evidence decides (:mod:`evidence`): each trial
  task's pace is compared with the preferred runtime's just before the trial (the median of
  its last tasks that ran alone), the differences are kept per pair of runtimes across trials,
  and a signed-rank test says whether they lie below zero or above it. When it tells the two
  apart (:data:`~hetero.framework.scheduler.evidence.SIGNIFICANT_Z`), the runner-up's estimate
  is set to the preferred runtime's times the median difference (its own evidence: not shared
  with the group); a runner-up that is then faster becomes the preferred runtime, and the
  former one the runner-up, tried in turn with the pair's evidence read the other way. While
  the test cannot tell them apart the ranking stands and the next trial comes after a longer
  period (at most :data:`UNDECIDED_BACKOFF` times as long). Until 2026-12-07 each trial moved
  the runner-up's figure half-way to the median of its own four tasks: at concurrency 1 one
  request's size and the machine's noise moved a task's pace by more than the runtimes
  differ, and a free stack changed its images' runtime four times in eleven trials. Comparing
  a trial with the preferred runtime's paces from other minutes does no better on a machine
  whose speed drifts: a first version of the test that did changed runtimes five times in 80 s.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from hetero.framework.scheduler.core_shares import CoreSharesMixin
from hetero.framework.scheduler.evidence import SIGNIFICANT_Z, Paces, PairEvidence, signed_rank_z
from hetero.framework.scheduler.tables import StageTables

__all__ = ["EXPLORE_EVERY", "ExploringMixin"]

logger = logging.getLogger(__name__)

# One batch in this many + 1 may go to a runtime estimated slower: the cost of checking, at
# most 1/33 of a model's batches on a compute resource, each slower by at most the drift that
# allowed it. Each trial whose runner-up stays the slower doubles the period, up to
# MAX_BACKOFF times it (a load whose drift the ranking has already survived is checked less
# and less) where the evidence shows it slower, UNDECIDED_BACKOFF times while it cannot tell;
# a runner-up that takes over resets it.
EXPLORE_EVERY = 32
MAX_BACKOFF = 32
# While a trial's evidence cannot tell the runner-up from the preferred runtime (the rank
# test, evidence.py), the period backs off only up to this many times: at most one task in 32
# goes to a runtime not shown slower, and the runner-up's evidence keeps growing (64 tasks in
# 16 trials) until it decides. In a simulated run of 1,920 tasks at concurrency 1 with 15 %
# noise a task, a runner-up a tenth faster took the model in 4 of 5 seeds with the period
# doubling up to MAX_BACKOFF, in 5 of 5 with this limit.
UNDECIDED_BACKOFF = 4
# A trial measures at least this many tasks (with the earlier trials' tasks, they are the
# runner-up's evidence): one task at concurrency 1 measured 1.34x the other runtime where the
# probes and 300 requests in process said 1.06-1.09x.
TRIAL_TASKS = 4


@dataclass(slots=True)
class _Trial:
    """A runner-up being measured against the preferred runtime: tasks still to send it,
    tasks sent and not finished, the ratios measured (measured over modelled, per finished
    task), whether its first task only warms it up (it was not loaded), and tasks of the model
    placed elsewhere while it was given none."""

    device: int
    preferred: int
    size: int
    warming: bool
    left: int = 0
    sent: int = 0
    passed: int = 0
    ratios: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _GroupRecord:
    """A model on one compute resource: batches since its last trial, and the period."""

    batches: float = 0.0
    period: float = EXPLORE_EVERY


class ExploringMixin(CoreSharesMixin):
    """Trials of the runner-up runtime of a compute resource (module docstring)."""

    _explore: dict[tuple[str, int], _GroupRecord]  # per (model key, compute group)
    _trials: dict[str, dict[int, _Trial]]  # per model key: trials under way by device
    _paces: dict[tuple[str, int], Paces]  # per (model key, device): recent paces, alone
    _pairs: dict[tuple[str, int, int], PairEvidence]  # per (model key, two devices, ordered)

    def _init_exploring(self) -> None:
        self._calibrated = {}
        self._probe_spread = {}
        self._core_share = {}  # what warm-up measured beside the timings (core_shares.py)
        self._core_weights = {}
        self._explore = {}
        self._trials = {}
        self._paces = {}
        self._pairs = {}

    def _trial_mask(self, tables: StageTables, mask: np.ndarray) -> np.ndarray | None:
        """``mask`` without the other devices of the compute resource of each trial of this
        model that has tasks to send and room for one (None: no trial narrows it)."""
        trials = self._trials.get(tables.costs.key)
        if not trials:
            return None
        narrowed = None
        group = self._compute_group
        for index, trial in trials.items():
            if trial.left > 0 and mask[index]:
                others = group == group[index]
                others[index] = False
                narrowed = (mask if narrowed is None else narrowed) & ~others
        return narrowed

    def _trial_took(self, tables: StageTables, index: int) -> bool:
        """Whether device ``index`` is a trial's with tasks to send: then it takes this one."""
        trials = self._trials.get(tables.costs.key)
        trial = trials.get(index) if trials else None
        if trial is None or trial.left <= 0:
            return False
        trial.left -= 1
        trial.sent += 1
        return True

    def _trial_passed(self, tables: StageTables, narrowed: np.ndarray, *, refused: bool) -> None:
        """A task of the model did not go to a trial's device that had room: it could not
        take it (``refused``: no memory without evicting busy models), or another resource's
        device won it. A refused trial ends; one that was given nothing while
        :data:`EXPLORE_EVERY` of the model's tasks went elsewhere ends too (its device keeps
        losing to another resource's)."""
        trials = self._trials.get(tables.costs.key)
        if not trials:
            return
        for device, trial in list(trials.items()):
            if trial.left <= 0 or not narrowed[device]:
                continue
            trial.passed += 1
            if refused or (trial.sent == 0 and trial.passed > EXPLORE_EVERY):
                del trials[device]

    def _trial_finished(self, tables: StageTables, index: int, ratio: float | None) -> bool:
        """A task of a trial on ``index`` finished (``ratio``: measured over modelled, None
        when it failed or nothing was judged); True when the task was a trial's (its
        correction is not shared)."""
        key = tables.costs.key
        trials = self._trials.get(key)
        trial = trials.get(index) if trials else None
        if trial is None or trial.sent == 0:
            return False
        trial.sent -= 1
        if trial.warming:  # its first task loaded it: not its pace; now the measured batch
            trial.warming = False
            trial.left = trial.size
            return True
        if ratio is not None:
            trial.ratios.append(ratio)
        if trial.left == 0 and trial.sent == 0:
            assert trials is not None
            del trials[index]
            if trial.ratios:
                self._judge_trial(tables, trial)
        return True

    def _record_pace(self, tables: StageTables, index: int, ratio: float) -> None:
        """Keep a task's pace on device ``index`` (``ratio``: measured over modelled) among the
        last ones of its model there (:class:`~hetero.framework.scheduler.evidence.Paces`):
        what a trial of another runtime is compared with."""
        pace = _log_pace(tables, index, ratio)
        if pace is not None:
            self._paces.setdefault((tables.costs.key, index), Paces()).add(pace)

    def _judge_trial(self, tables: StageTables, trial: _Trial) -> None:
        """Compare the trial's paces with the preferred runtime's just before it, add the
        differences to the pair's evidence, and test it (module docstring): where the test
        tells the two apart, the runner-up's estimate is the preferred runtime's times the
        median difference; the period backs off while it stays the slower."""
        key, index, preferred = tables.costs.key, trial.device, trial.preferred
        first, second = min(index, preferred), max(index, preferred)
        evidence = self._pairs.setdefault((key, first, second), PairEvidence(first))
        before = self._paces.get((key, preferred))
        baseline = before.median() if before is not None else math.nan
        if not math.isnan(baseline):
            for ratio in trial.ratios:
                pace = _log_pace(tables, index, ratio)
                if pace is not None:
                    evidence.add(index, pace - baseline)
        differences = evidence.toward(index)
        z = signed_rank_z(differences)
        correction = tables.correction
        unit = float(tables.costs.marginal_s[index, 0])  # one item as modelled, uncorrected
        if abs(z) >= SIGNIFICANT_Z and unit > 0:
            estimate = float(tables.unit_s[preferred]) * math.exp(float(np.median(differences)))
            correction[index] = estimate / unit
            tables.refresh(index)
        self.stats.counts["runtime_trials"] += 1
        group = int(self._compute_group[index])
        record = self._explore.setdefault((tables.costs.key, group), _GroupRecord())
        if float(tables.unit_s[index]) < float(tables.unit_s[preferred]):
            record.period = EXPLORE_EVERY  # it takes over: the new ranking is checked as often
            self.stats.counts["runtime_takeovers"] += 1
        elif z >= SIGNIFICANT_Z:  # told apart, and slower: checked less and less
            record.period = min(record.period * 2, EXPLORE_EVERY * MAX_BACKOFF)
        else:  # not yet told apart: the evidence grows at the same rate
            record.period = min(record.period * 2, EXPLORE_EVERY * UNDECIDED_BACKOFF)
        logger.info(
            "%s: runner-up %s tried under load: %d tasks there, each against %s's just "
            "before, rank test z %.1f (%s; one item %.2f ms there, %.2f ms on %s; next trial "
            "after %d batches)",
            key,
            self.devices[index].id,
            len(evidence),
            self.devices[preferred].id,
            z,
            "told apart" if abs(z) >= SIGNIFICANT_Z else "not told apart: the ranking stands",
            float(tables.unit_s[index]) * 1e3,
            float(tables.unit_s[preferred]) * 1e3,
            self.devices[preferred].id,
            int(record.period),
        )

    def _batch_counted(
        self, tables: StageTables, index: int, items: int, batch_size: int, ratio: float
    ) -> None:
        """A task of ``items`` items of a batch of ``batch_size`` items finished on ``index``
        (the preferred runtime) at ``ratio`` times the cost model's figure: keep its pace
        (where core shares are measured, only if it ran alone), and after a period of batches
        (:data:`EXPLORE_EVERY`, backed off) start a trial of the runner-up if it may be faster
        (module docstring)."""
        group = int(self._compute_group[index])
        record = self._explore.setdefault((tables.costs.key, group), _GroupRecord())
        stage = tables.costs.key.split("/", 1)[0]
        if stage in self._core_weights and not self._ran_alone(tables, index):
            # a trial times a runtime as warm-up's probe did, alone: while the cores run other
            # work too, a batch's wall time rewards the runtime that takes more of them, and
            # the core shares rank the runtimes there (core_shares.py); tried when idle, and
            # judged against the preferred runtime's correction learnt while idle: the period
            # starts again, so a trial waits for a period of batches run alone (the correction
            # then forgot the load's level, ``measured_smoothing``)
            record.batches = 0
            return
        self._record_pace(tables, index, ratio)  # what a trial is judged against
        batch_size = max(1, batch_size)
        record.batches += min(1.0, max(1, items) / batch_size)  # each task reports its share
        if record.batches < record.period:
            return
        trials = self._trials.setdefault(tables.costs.key, {})
        members = np.flatnonzero(self._compute_group == group)
        for member in [int(m) for m in members if int(m) in trials]:
            if self.healthy[member] and not tables.draining[member]:
                record.batches = 0
                return  # one trial at a time per resource
            del trials[member]  # its device left placement: it cannot finish
        runner_up = self._runner_up(tables, index, members, batch_size)
        if runner_up is not None and not tables.resident[runner_up]:
            # its load runs on the cores the resource's runtimes share: paid from the same
            # budget as a trial's batches, EXPLORE_EVERY of the preferred's for one of its own
            batch_s = _batch_estimate(tables, index, batch_size)
            owed = EXPLORE_EVERY * float(tables.costs.load_s[runner_up]) / max(batch_s, 1e-9)
            if record.batches < record.period + owed:
                return
        record.batches = 0
        if runner_up is not None:
            # the batch's tasks, about, and at least TRIAL_TASKS: one task's time varies by
            # as much as the probes' spread, so one alone would decide on noise
            tasks = max(TRIAL_TASKS, round(batch_size / max(1, items)))
            warming = not bool(tables.resident[runner_up])
            trials[runner_up] = _Trial(
                runner_up, index, tasks, warming, left=1 if warming else tasks
            )

    def _ran_alone(self, tables: StageTables, index: int) -> bool:
        """Whether nothing but the model's own tasks on device ``index`` (the rest of the
        batch that just finished a task there) is in flight anywhere, and no other request is
        live: the cores ran the batch alone, as warm-up's probe did."""
        if self.requests_live > 1:
            return False
        return float(self.in_flight.sum()) <= float(tables.pending[index])

    def _runner_up(
        self, tables: StageTables, index: int, members: np.ndarray, batch_size: int
    ) -> int | None:
        """The group's other runtime to measure, or None: the best estimate among those that
        may be faster than ``index`` by what the cost model's drift there allows or the probes'
        spread on either of the two, or warm-up's fastest while ``index`` is not it."""
        key = tables.costs.key
        costs = tables.costs
        others = [
            int(m)
            for m in members
            if int(m) != index
            and costs.runnable[m]
            and self.healthy[m]
            and not tables.draining[m]
            # loaded, or loadable without evicting anything: a trial never costs a model
            and (tables.resident[m] or self.memory[m].free >= int(tables.resident_bytes[m]))
        ]
        if not others:
            return None

        def estimate(device: int, correction: float) -> float:
            return _batch_estimate(tables, device, batch_size, correction)

        best = min(others, key=lambda m: estimate(m, float(tables.correction[m])))
        calibrated = self._calibrated.get((key, index), 1.0)
        drift = float(tables.correction[index]) / calibrated if calibrated > 0 else 1.0
        band = max(drift, 1.0 / drift) if drift > 0 else 1.0
        stage = key.split("/", 1)[0]  # what the probes themselves could not tell apart
        spread = self._probe_spread
        band = max(band, spread.get((stage, index), 1.0), spread.get((stage, best), 1.0))
        if estimate(best, float(tables.correction[best])) < band * estimate(
            index, float(tables.correction[index])
        ):
            return best
        warm_best = min(
            [index, *others], key=lambda m: estimate(m, self._calibrated.get((key, m), 1.0))
        )
        return warm_best if warm_best != index else None


def _log_pace(tables: StageTables, device: int, ratio: float) -> float | None:
    """A task's pace on ``device`` (``ratio``: measured over modelled) as the logarithm of one
    item's time there: the cost model's one-item figure, uncorrected, times ``ratio``, so two
    runtimes' paces compare directly (None where either is not positive)."""
    unit = float(tables.costs.marginal_s[device, 0])
    return math.log(ratio * unit) if ratio > 0 and unit > 0 else None


def _batch_estimate(
    tables: StageTables, device: int, batch_size: int, correction: float | None = None
) -> float:
    """The cost model's time of a batch of ``batch_size`` on ``device`` (the policy's batch
    bound applied), times ``correction`` (by default the device's own)."""
    costs = tables.costs
    size = min(max(1, batch_size), costs.hint.max_batch)
    batches = costs.batch_s[device] if costs.batch_s else ()
    modelled = batches[size] if size < len(batches) else costs.marginal_s[device, 0] * size
    if correction is None:
        correction = float(tables.correction[device])
    return float(modelled) * correction
