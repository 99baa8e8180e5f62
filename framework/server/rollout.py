"""Zero-downtime model version swaps: which version of a stage answers each request, and the
move from one version to the next when a policy reload changes ``stages.<name>.model_version``.

A swap loads the new version beside the old one as a stage of its own in the same engine
(``<stage>@<model_version>``: its own queue, placement, residency, lanes and breakers), warms
it up and probes it with its plugin's warm-up input through the engine. Then, per
``stages.<name>.rollout``:

- ``all_at_once``: the new version is the stage from the moment the reload answers;
- ``canary``: every 1/``canary_share``-th request goes to it (counted, not drawn) until
  ``canary_s`` have passed and it answered ``canary_min_requests``; a canary request that
  fails is answered by the old version instead (the caller sees no failure) and counted; more
  failures than ``max_error_rate`` of ``max(answered, canary_min_requests)`` roll it back.

The version that stops serving is drained (every request that chose it finishes on it) and
then unloaded. A version that fails to load or to answer its probe is unloaded at once and
the reload is refused (:class:`RolloutFailedError`): the old version and the old policy keep
serving. A request's version is chosen once, when it starts (a large embedding request's
parts all run on it), and reported in its ``X-Hetero-Stages`` entry (``model_version``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hetero.framework.errors import InvalidInputError, PolicyError, ShedError
from hetero.framework.policy.schema import RolloutConfig, StageConfig
from hetero.framework.stage_plugin import stage_kind

if TYPE_CHECKING:
    from hetero.framework.server.served import ServedStage
    from hetero.framework.server.serving import Serving

__all__ = ["ModelVersions", "Rollout", "RolloutFailedError", "Ticket"]

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 300.0
ACTIVE = frozenset({"canary", "draining", "rolling_back"})


class RolloutFailedError(PolicyError, RuntimeError):
    """The new model version could not load or failed its probe; it was unloaded and the
    old version keeps serving."""

    def __init__(self, stage: str, version: str, reason: str) -> None:
        self.stage = stage
        self.version = version
        self.reason = reason
        super().__init__(
            f"stages.{stage}.model_version: version {version!r} was not swapped in "
            f"(the old version keeps serving): {reason}"
        )


@dataclass
class Rollout:
    """One swap of a stage from one model version to the next, and how it went.

    ``state``: ``canary`` (a share of requests goes to the new version), ``draining`` (the
    new version serves; the old finishes its requests), ``done`` (the old is unloaded),
    ``rolling_back`` / ``rolled_back`` (the new version failed its probe or canary and is
    being / was unloaded; the old serves), ``failed`` (unloading raised: see the log).
    """

    stage: str
    old: ServedStage
    new: ServedStage
    config: RolloutConfig
    state: str = "loading"
    reason: str = ""
    started_at: float = field(default_factory=time.monotonic)
    switched_at: float | None = None
    routed: Counter[str] = field(default_factory=Counter)  # canary decisions: old / new
    answered: int = 0  # canary requests the new version answered
    failed: int = 0  # canary requests it failed (answered again by the old one)
    probe_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the reload report and ``GET /admin/rollouts``)."""
        return {
            "stage": self.stage,
            "from": self.old.config.model_version,
            "to": self.new.config.model_version,
            "strategy": self.config.strategy,
            "state": self.state,
            "reason": self.reason,
            "probe_s": self.probe_s,
            "canary": {
                "share": self.config.canary_share,
                "routed_old": self.routed["old"],
                "routed_new": self.routed["new"],
                "answered": self.answered,
                "failed": self.failed,
            },
        }


class Ticket:
    """The version one request runs on; :meth:`close` it when the request ends."""

    def __init__(self, versions: ModelVersions, stage: ServedStage, canary: Rollout | None):
        self.versions = versions
        self.stage = stage
        self.canary = canary
        self._open = True

    def failed(self, error: BaseException) -> Ticket | None:
        """The request failed on this version. For a canary request failing on the model
        (not on its input or on load), this closes the ticket, counts the failure and gives
        a ticket for the version that serves the stage, to answer it again; otherwise None."""
        if self.canary is None or isinstance(error, InvalidInputError | ShedError):
            return None
        if getattr(error, "status", 500) < 500:  # an API error: the request's own fault
            return None
        return self.versions.canary_failed(self, error)

    def close(self) -> None:
        """The request ended (idempotent); a canary answer is counted as answered."""
        if self._open:
            self._open = False
            self.versions.release(self)


class ModelVersions:
    """The versions of each served stage: requests' choice of version, and swaps."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self._cond = threading.Condition()
        self._inflight: Counter[str] = Counter()  # requests per engine stage
        self._canaries: dict[str, Rollout] = {}
        self.rollouts: dict[str, Rollout] = {}  # the latest per stage

    # --- requests --------------------------------------------------------------------

    def pick(self, stage: ServedStage) -> Ticket:
        """The version a request of ``stage`` runs on (the stage's current one, or during a
        canary every 1/share-th request the new one)."""
        with self._cond:
            current = self.serving.stages.get(stage.name, stage)
            rollout = self._canaries.get(stage.name)
            chosen, canary = current, None
            if rollout is not None:
                share = rollout.config.canary_share
                seen = rollout.routed["old"] + rollout.routed["new"]
                if math.floor((seen + 1) * share) > math.floor(seen * share):
                    chosen, canary = rollout.new, rollout
                rollout.routed["new" if canary else "old"] += 1
            self._inflight[chosen.engine_name] += 1
            return Ticket(self, chosen, canary)

    def release(self, ticket: Ticket) -> None:
        """A request on ``ticket``'s version ended (:meth:`Ticket.close`)."""
        promote = None
        with self._cond:
            self._inflight[ticket.stage.engine_name] -= 1
            rollout = ticket.canary
            if rollout is not None and rollout.state == "canary":
                rollout.answered += 1
                if self._canary_over(rollout):
                    promote = rollout
                    self._switch(rollout)
            self._cond.notify_all()
        if promote is not None:
            logger.info("stage %s: canary of %s passed", promote.stage, promote.new.engine_name)

    def canary_failed(self, ticket: Ticket, error: BaseException) -> Ticket:
        """Count a canary failure (rolling back past the error budget) and hand the request
        to the version that serves the stage."""
        rollout = ticket.canary
        assert rollout is not None
        ticket._open = False
        back = False
        with self._cond:
            self._inflight[ticket.stage.engine_name] -= 1
            rollout.failed += 1
            budget = rollout.config.max_error_rate * max(
                rollout.answered + rollout.failed, rollout.config.canary_min_requests
            )
            if rollout.state == "canary" and rollout.failed > budget:
                back = True
                self._canaries.pop(rollout.stage, None)
                rollout.state = "rolling_back"
                rollout.reason = (
                    f"{rollout.failed} of {rollout.answered + rollout.failed} canary requests "
                    f"failed (last: {type(error).__name__}: {error})"
                )
            self._cond.notify_all()
            primary = self.serving.stages.get(rollout.stage, rollout.old)
            self._inflight[primary.engine_name] += 1
        logger.warning(
            "stage %s: canary request failed on %s: %s",
            rollout.stage,
            ticket.stage.engine_name,
            error,
        )
        if back:
            self.serving.use_policy(
                self.serving.current_policy.with_stages({rollout.stage: rollout.old.config})
            )
        return Ticket(self, primary, None)

    def _canary_over(self, rollout: Rollout) -> bool:
        """Whether the canary has run its time and count (lock held)."""
        config = rollout.config
        return (
            rollout.answered >= config.canary_min_requests
            and time.monotonic() - rollout.started_at >= config.canary_s
        )

    def _switch(self, rollout: Rollout) -> None:
        """Make the new version the stage's: every request from now on runs on it (lock
        held)."""
        self._canaries.pop(rollout.stage, None)
        self.serving.stages = {**self.serving.stages, rollout.stage: rollout.new}
        rollout.state = "draining"
        rollout.switched_at = time.monotonic()
        self._cond.notify_all()

    # --- swaps -----------------------------------------------------------------------

    def prepare(self, name: str, config: StageConfig) -> Rollout:
        """Load version ``config`` of served stage ``name`` beside the one serving, and probe
        it through the engine; nothing is routed to it yet.

        Raises:
            RolloutFailedError: it cannot serve this stage, load or answer its probe (it was
                unloaded again).
        """
        serving = self.serving
        version = config.model_version
        old = serving.stages.get(name)
        if old is None:
            raise RolloutFailedError(name, version, "the stage is not served (a restart loads it)")
        if old.sensitive:
            raise RolloutFailedError(name, version, "a sandboxed stage swaps only by a restart")
        with self._cond:
            if name in self.rollouts and self.rollouts[name].state in ACTIVE:
                raise RolloutFailedError(name, version, "a swap of this stage is in progress")
        classes = serving.stage_classes()
        key = stage_kind(name, version, classes)
        cls = classes.get(key) if key is not None else None
        kind = getattr(cls, "name", key)
        if cls is None or kind != old.kind:
            found = f"a {kind} model" if cls is not None else "no model plugin"
            raise RolloutFailedError(name, version, f"{found} serves it; the stage is {old.kind}")
        engine = serving.engine
        assert engine is not None
        engine_name = self._fresh_name(f"{name}@{version}".replace("/", "_"), engine.status)
        plugin = cls(cache_dir=serving.model_cache_dir)
        new = dataclasses.replace(old, config=config, plugin=plugin, engine_stage=engine_name)
        rollout = Rollout(name, old, new, config.rollout)
        engine.hold_config(old.engine_name, old.config)
        engine.add_stage(engine_name, config, plugin, like=old.engine_name)
        try:
            failed = engine.warm_up([engine_name])
            if failed:
                raise RuntimeError(failed[engine_name])
            probe = plugin.probe_payload()
            if probe is not None:
                began = time.monotonic()
                future = engine.submit_stage(engine_name, probe, variant="full")
                try:
                    future.result(timeout=PROBE_TIMEOUT_S)
                except FutureTimeoutError:
                    future.cancel()
                    raise RuntimeError(f"the probe took over {PROBE_TIMEOUT_S:.0f} s") from None
                rollout.probe_s = time.monotonic() - began
        except Exception as err:
            self._unload(engine_name)
            rollout.state, rollout.reason = "rolled_back", f"{type(err).__name__}: {err}"
            with self._cond:
                self.rollouts[name] = rollout
            serving.metrics.model_rollouts.labels(name, "rolled_back").inc()
            logger.error("stage %s: version %s failed: %s", name, version, rollout.reason)
            raise RolloutFailedError(name, version, rollout.reason) from err
        return rollout

    def discard(self, rollout: Rollout) -> None:
        """Unload a prepared version that will not be started (another stage's failed)."""
        self._unload(rollout.new.engine_name)

    def start(self, rollout: Rollout) -> None:
        """Shift traffic to a prepared version per its rollout strategy; the old one is
        drained and unloaded (or, after a failed canary, the new one) on a thread."""
        with self._cond:
            self.rollouts[rollout.stage] = rollout
            rollout.started_at = time.monotonic()
            if rollout.config.strategy == "canary":
                rollout.state = "canary"
                self._canaries[rollout.stage] = rollout
            else:
                self._switch(rollout)
        threading.Thread(
            target=self._finish_logged,
            args=(rollout,),
            name=f"hetero-rollout-{rollout.stage}",
            daemon=True,
        ).start()

    def _finish_logged(self, rollout: Rollout) -> None:
        try:
            self._finish(rollout)
        except Exception as err:  # a bug here must still end the swap, visibly
            logger.exception("stage %s: swap did not finish", rollout.stage)
            with self._cond:
                rollout.state = "failed"
                rollout.reason = f"the swap did not finish: {type(err).__name__}: {err}"
                self._cond.notify_all()

    def _finish(self, rollout: Rollout) -> None:
        """Wait for the canary's end (if any), drain the version that stopped serving and
        unload it."""
        with self._cond:
            while rollout.state == "canary":
                if self._canary_over(rollout):
                    self._switch(rollout)
                    break
                remaining = rollout.config.canary_s - (time.monotonic() - rollout.started_at)
                self._cond.wait(timeout=remaining if remaining > 0 else None)
            promoted = rollout.state == "draining"
            leaving = rollout.old if promoted else rollout.new
            self._cond.wait_for(lambda: self._inflight[leaving.engine_name] <= 0)
        self._unload(leaving.engine_name)
        with self._cond:
            rollout.state = "done" if promoted else "rolled_back"
            self._cond.notify_all()
        outcome = "promoted" if promoted else "rolled_back"
        self.serving.metrics.model_rollouts.labels(rollout.stage, outcome).inc()
        logger.info(
            "stage %s: %s %s -> %s%s",
            rollout.stage,
            outcome,
            rollout.old.config.model_version,
            rollout.new.config.model_version,
            f" ({rollout.reason})" if rollout.reason else "",
        )

    def _unload(self, engine_name: str) -> None:
        engine = self.serving.engine
        if engine is None or engine_name not in engine.plugins:
            return
        while True:  # the last request's engine task ends a moment after its caller's
            try:
                engine.remove_stage(engine_name)
                return
            except RuntimeError:
                with self._cond:
                    self._cond.wait(timeout=0.05)

    @staticmethod
    def _fresh_name(base: str, taken: Mapping[str, Any]) -> str:
        name, number = base, 1
        while name in taken:
            number += 1
            name = f"{base}~{number}"
        return name

    # --- reporting -------------------------------------------------------------------

    def report(self) -> dict[str, dict[str, Any]]:
        """The latest swap of each stage."""
        with self._cond:
            return {name: rollout.to_dict() for name, rollout in sorted(self.rollouts.items())}

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no swap is in progress (or ``timeout_s``); whether none is."""
        with self._cond:
            return self._cond.wait_for(
                lambda: all(r.state not in ACTIVE for r in self.rollouts.values()), timeout_s
            )
