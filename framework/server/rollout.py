"""Zero-downtime model version swaps: the move from one model version of a stage to the next
when a policy reload changes ``stages.<name>.model_version`` (which version answers each
request is the engine's choice: ``framework/engine/version_routing.py``).

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
import threading
import time
from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hetero.framework.engine.version_routing import Canary, VersionRouter
from hetero.framework.errors import PolicyError
from hetero.framework.policy.schema import RolloutConfig, StageConfig
from hetero.framework.stage_plugin import stage_kind

if TYPE_CHECKING:
    from hetero.framework.server.served import ServedStage
    from hetero.framework.server.serving import Serving

__all__ = ["ModelVersions", "Rollout", "RolloutFailedError"]

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
    Requests are routed by the engine (:class:`~hetero.framework.engine.version_routing.
    VersionRouter`); ``canary`` is its record of the canary's requests.
    """

    stage: str
    old: ServedStage
    new: ServedStage
    config: RolloutConfig
    state: str = "loading"
    reason: str = ""
    started_at: float = field(default_factory=time.monotonic)
    switched_at: float | None = None
    canary: Canary | None = None
    probe_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the reload report and ``GET /admin/rollouts``)."""
        canary = self.canary
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
                "routed_old": canary.routed["old"] if canary else 0,
                "routed_new": canary.routed["new"] if canary else 0,
                "answered": canary.answered if canary else 0,
                "failed": canary.failed if canary else 0,
            },
        }


class ModelVersions:
    """The swaps of each served stage's model version (the engine routes each request to a
    version: ``engine.routing``)."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self._cond = threading.Condition()
        self.rollouts: dict[str, Rollout] = {}  # the latest per stage

    def _router(self) -> VersionRouter:
        engine = self.serving.engine
        assert engine is not None
        engine.routing.on_end = self._canary_ended
        return engine.routing

    def _canary_ended(self, canary: Canary) -> None:
        """The engine ended a canary (on the thread of the request that ended it)."""
        with self._cond:
            rollout = self.rollouts.get(canary.stage)
        if rollout is not None and rollout.canary is canary:
            self._take_up(rollout, canary)

    def _take_up(self, rollout: Rollout, canary: Canary) -> None:
        """Act on the end of ``rollout``'s canary, once (the engine's word and the swap's own
        thread may both bring it): its version serves the stage now, or it failed and the old
        version's policy entry is put back."""
        with self._cond:
            if rollout.state != "canary" or canary.state == "canary":
                return  # taken up already, or not over
            if canary.state == "promoted":
                self.serving.stages = {**self.serving.stages, rollout.stage: rollout.new}
                rollout.state = "draining"
                rollout.switched_at = time.monotonic()
            else:
                rollout.state, rollout.reason = "rolling_back", canary.reason
            self._cond.notify_all()
        if canary.state != "promoted":
            self.serving.use_policy(
                self.serving.current_policy.with_stages({rollout.stage: rollout.old.config})
            )

    def _switch(self, rollout: Rollout) -> None:
        """Make the new version the stage's: every request from now on runs on it."""
        self._router().switch(rollout.stage, rollout.new.engine_name)
        with self._cond:
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
        router = self._router()
        with self._cond:
            self.rollouts[rollout.stage] = rollout
            rollout.started_at = time.monotonic()
        if rollout.config.strategy == "canary":
            rollout.canary = Canary(
                rollout.stage, rollout.old.engine_name, rollout.new.engine_name, rollout.config
            )
            with self._cond:
                rollout.state = "canary"
            router.start_canary(rollout.canary)
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
        router = self._router()
        canary = rollout.canary
        if canary is not None:
            router.settle_canary(canary)
            self._take_up(rollout, canary)
        promoted = canary is None or canary.state == "promoted"
        leaving = rollout.old if promoted else rollout.new
        router.wait_drained(leaving.engine_name)
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
