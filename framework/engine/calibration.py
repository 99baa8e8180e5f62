"""Warm-up timings kept between starts, so a start that already knows how fast each runtime
runs a model loads only the one placement will use.

Warm-up times a stage on every device that can run it (a probe, best of three timed runs) and places
it where it is fastest. On a CPU host that means loading the model into every runtime
(OpenVINO, ONNX Runtime, torch), which costs seconds and leaves the slower runtimes' memory
behind. The figure depends only on what ran and where, so it is kept, keyed by exactly that:
the model version and graph format, the plugin that builds the graph (its class and its
package's version), the device and its runtime's version, the intra-op threads, the probe's
size, the host's processor (model, cores, clock) and hetero's version.
Any of them changing is another key, measured afresh. A figure measured once is a
calibration, not a promise: in service the scheduler's corrections follow what runs measure.

The store is one small JSON file (``$HETERO_CALIBRATION_FILE``, by default in the model
cache), written atomically; a file that cannot be read is treated as empty (and rewritten),
never an error.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

from hetero.framework import envs
from hetero.framework.devices import DeviceSpec

__all__ = ["CalibrationKey", "CalibrationStore", "plugin_identity"]

logger = logging.getLogger(__name__)


def _hetero_version() -> str:
    try:
        return metadata.version("hetero")
    except metadata.PackageNotFoundError:
        return "unknown"


@cache
def _distributions() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def plugin_identity(plugin: object) -> str:
    """The class that builds a stage's graphs and the version of the package it ships in: a
    plugin upgraded in place (new weights, another export) under the same model version is
    another key."""
    cls = type(plugin)
    top = cls.__module__.split(".", 1)[0]
    versions = []
    for name in _distributions().get(top, ()):
        try:
            versions.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return f"{cls.__module__}.{cls.__qualname__}[{','.join(sorted(versions))}]"


@dataclass(frozen=True, slots=True)
class CalibrationKey:
    """What a warm-up timing depends on. ``items``: the probe's size; 0 for the model's
    load time on the device (timed when warm-up loaded it); -1 for the spread of the probe's
    timed runs (slowest over fastest); -2 for the share of the host's cores the probe kept busy."""

    model_version: str
    graph_format: str
    plugin: str
    device_id: str
    runtime_version: str
    threads: int
    items: float
    processor: str

    @classmethod
    def of(
        cls,
        model_version: str,
        graph_format: str,
        device: DeviceSpec,
        threads: int,
        items: float,
        plugin: object,
    ) -> CalibrationKey:
        """The key of a probe of ``model_version`` in ``graph_format``, built by ``plugin``,
        on ``device``."""
        props = device.properties
        processor = "/".join(
            str(part)
            for part in (
                device.host,
                device.vendor_name,
                props.get("physical_cores", ""),
                props.get("logical_cores", ""),
                props.get("clock_ghz", ""),
                _hetero_version(),
            )
        )
        return cls(
            model_version=model_version,
            graph_format=graph_format,
            plugin=plugin_identity(plugin),
            device_id=device.id,
            runtime_version=str(props.get("runtime_version", "")),
            threads=threads,
            items=float(items),
            processor=processor,
        )

    def text(self) -> str:
        """The key as one string (the JSON file's key)."""
        return "|".join(
            (
                self.model_version,
                self.graph_format,
                self.plugin,
                self.device_id,
                self.runtime_version,
                str(self.threads),
                repr(self.items),
                self.processor,
            )
        )


class CalibrationStore:
    """Seconds per probe (and per load; and a probe's spread and core share, ratios) by
    :class:`CalibrationKey`, kept in ``path`` (default:
    ``$HETERO_CALIBRATION_FILE``, else the model cache's ``calibration.json``)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else envs.calibration_file()
        self._lock = threading.Lock()

    def _read(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text("utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            logger.warning("calibration store %s unreadable, starting afresh: %s", self.path, err)
            return {}
        if not isinstance(data, dict):
            return {}
        return {
            str(key): float(value)
            for key, value in data.items()
            if isinstance(value, int | float) and value > 0
        }

    def get(self, key: CalibrationKey) -> float | None:
        """The kept seconds for ``key`` (None: never measured)."""
        with self._lock:
            return self._read().get(key.text())

    def put(self, key: CalibrationKey, seconds: float) -> None:
        """Keep ``seconds`` for ``key`` (best effort: a cache that cannot be written is
        logged and skipped)."""
        if seconds <= 0:
            return
        with self._lock:
            data = self._read()
            data[key.text()] = seconds
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True), "utf-8")
                os.replace(tmp, self.path)
            except OSError as err:
                logger.warning("calibration store %s not written: %s", self.path, err)
                tmp.unlink(missing_ok=True)
