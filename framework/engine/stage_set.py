"""Stages taken in and let go while the engine runs: a new model version loaded beside the one
serving, the old one unloaded once drained."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hetero.framework.engine.status import (
    StageStatus,
)
from hetero.framework.policy.schema import StageConfig
from hetero.framework.stage_plugin import StagePlugin

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = ["StageVersions"]

logger = logging.getLogger(__name__)


class StageVersions:
    """The engine's stages, as model versions come and go."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(
        self, name: str, config: StageConfig, plugin: StagePlugin, *, like: str | None = None
    ) -> None:
        """Take in a stage beside the running ones (a new model version, loaded while the old
        one serves): queued, placed, loaded, batched and metered like the stages the engine
        started with, with the threads, runtime pin and CPU priority of stage ``like``.
        :meth:`warm_up` it next; :meth:`remove_stage` unloads it."""
        with self.engine._lock:
            if name in self.engine.status or name in self.engine.scheduler.queues:
                raise ValueError(f"stage {name!r} is already known to the engine")
            if like is not None:
                _copy_setting(self.engine._threads, like, name)
                _copy_setting(self.engine._pinned, like, name)
                _copy_setting(self.engine._nice, like, name)
            self.engine._added[name] = config
            self.engine.policy = self.engine.policy.with_stages({name: config})
            self.engine.admission.policy = self.engine.policy
            self.engine.scheduler.add_stage(
                name, self.engine.scheduler.policy.with_stages({name: config})
            )
            self.engine.plugins[name] = plugin
            self.engine.status[name] = StageStatus()
            self.engine.admission.reset_stage(name)
        self.engine.metrics.queue_depth.labels(name).set_function(
            lambda: self.engine.scheduler.queued(name)
        )
        for device in self.engine.fleet.devices:
            self.engine.metrics.loads.labels(name, device.id)
            self.engine.metrics.evictions.labels(name, device.id)
            self.engine.metrics.breaker_state.labels(name, device.id).set(0)

    def hold_config(self, name: str, config: StageConfig) -> None:
        """Keep ``config`` for stage ``name`` whatever later policies say of it: a model
        version being replaced runs by its own config until :meth:`remove_stage`."""
        with self.engine._lock:
            self.engine._added[name] = config
            self.engine.policy = self.engine.policy.with_stages({name: config})
            self.engine.admission.policy = self.engine.policy

    def remove(self, name: str) -> None:
        """Unload a stage that has no work left (the old model version once drained, or a new
        one rolled back): its models leave every device, its lanes stop, its plugin closes;
        a request naming it from now on is an unknown stage.

        Raises:
            RuntimeError: it still has tasks queued or running.
        """
        with self.engine._lock:
            if self.engine.scheduler.queued(name) or self.engine.admission.running(name):
                raise RuntimeError(f"stage {name!r} still has work queued or running")
            plugin = self.engine.plugins.pop(name)
            self.engine._added.pop(name, None)
            keys = [
                f"{name}/{variant}" for variant in self.engine.policy.spec.stages[name].variants
            ]
            for index, device in enumerate(self.engine.fleet.devices):
                for key in keys:
                    if key in self.engine.scheduler.memory[index].resident:
                        self.engine.scheduler.release(device.id, key)
                        self.engine.metrics.evictions.labels(name, device.id).inc()
            self.engine.status[name].state = "unloaded"
        with self.engine._lanes_lock:
            lanes = [
                self.engine._lanes.pop(key) for key in list(self.engine._lanes) if key[0] == name
            ]
        for lane in lanes:
            lane.stop()
        for models in self.engine.models.values():
            for key in keys:
                models.evict(key)
        plugin.close()


def _copy_setting(settings: dict[str, Any], source: str, target: str) -> None:
    if source in settings:
        settings[target] = settings[source]
