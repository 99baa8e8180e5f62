"""The backend interface every device family implements.

A backend discovers its devices, reads their telemetry, compiles a :class:`ComputeGraph` for a
device, loads and unloads it with honest memory accounting, runs it, and moves arrays between
devices. Public methods validate arguments and translate vendor exceptions into hetero's own
(:mod:`hetero.framework.errors`), then call a private hook (``compile`` -> ``_compile``), so every
backend gets the same error behaviour for free. A subclass that leaves a hook out fails when it
is instantiated, not mid-request.

Optional capabilities are explicit class flags (``supports_graph_capture``,
``supports_peer_copy``) for callers to read instead of probing; the capture hook raises
:class:`UnsupportedCapabilityError` by default.
"""

from __future__ import annotations

import abc
import itertools
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.errors import (
    BackendError,
    CompileError,
    DeviceUnhealthyError,
    ExecutionError,
    HeteroError,
    TransferError,
    UnknownDeviceError,
    UnsupportedCapabilityError,
)
from hetero.framework.faults import describe
from hetero.framework.graph import ComputeGraph, GraphFormat

__all__ = ["Backend", "Executable", "LatencyStats", "LoadedModel", "RunResult", "batch_size"]

logger = logging.getLogger(__name__)

Arrays = Mapping[str, np.ndarray[Any, Any]]


@dataclass(frozen=True, slots=True)
class Executable:
    """A graph compiled (prepared) for one device but not yet resident in its memory."""

    graph: ComputeGraph
    device_id: str
    native: Any


@dataclass(slots=True)
class LatencyStats:
    """Measured run latency of one loaded model: count, last, and a moving average per item."""

    runs: int = 0
    last_s: float = 0.0
    mean_per_item_s: float = 0.0
    smoothing: float = 0.2

    def record(self, seconds: float, items: int) -> None:
        """Fold in one run of ``items`` items that took ``seconds``."""
        per_item = seconds / max(items, 1)
        self.last_s = seconds
        if self.runs == 0:
            self.mean_per_item_s = per_item
        else:
            self.mean_per_item_s += self.smoothing * (per_item - self.mean_per_item_s)
        self.runs += 1


_model_ids = itertools.count(1)


@dataclass(slots=True)
class LoadedModel:
    """A graph resident on a device, ready to run.

    Attributes:
        handle: Unique id of this load.
        graph: The graph that was loaded.
        device_id: Where it lives.
        memory_bytes: Device memory this load is accounted for; returned on unload.
        native: The runtime's object (compiled model, session, module).
        latency: Measured latencies, to refine the graph's BandwidthHint.
        captured: Whether runs replay a captured graph (CUDA/HIP Graph).
    """

    graph: ComputeGraph
    device_id: str
    memory_bytes: int
    native: Any
    latency: LatencyStats = field(default_factory=LatencyStats)
    captured: bool = False
    handle: str = field(default_factory=lambda: f"model-{next(_model_ids)}")


@dataclass(frozen=True, slots=True)
class RunResult:
    """Outputs of one run, with its measured wall time."""

    outputs: dict[str, np.ndarray[Any, Any]]
    latency_s: float


class Backend(abc.ABC):
    """One family of devices (a vendor runtime), as the scheduler and the engine see it.

    Class attributes hold static facts: ``name`` (the registry name and device id prefix),
    ``visible_devices_env_var`` (``CUDA_VISIBLE_DEVICES`` and the like), and the capability flags.
    """

    name: ClassVar[str]
    visible_devices_env_var: ClassVar[str | None] = None
    supports_graph_capture: ClassVar[bool] = False
    supports_peer_copy: ClassVar[bool] = False
    produces_outputs: ClassVar[bool] = True
    """False for a modelling backend (``sim``): runs return no outputs and a modelled latency."""
    graph_formats: ClassVar[frozenset[GraphFormat]] = frozenset({GraphFormat.ONNX})
    """Graph formats :meth:`compile` accepts; the scheduler places a stage only where it runs."""
    supports_model_hosts: ClassVar[bool] = False
    """True where a device's models live, and its stages' batches run, outside this process (a
    Ray node): :meth:`model_host` gives the engine that device's host."""
    supports_membership: ClassVar[bool] = False
    """True where devices come and go while running (a cluster's nodes): the engine polls
    :meth:`poll_membership`."""

    def __init__(self) -> None:
        self._devices: tuple[DeviceSpec, ...] | None = None
        self._loaded: dict[str, LoadedModel] = {}
        self._unhealthy: dict[str, str] = {}
        self._lock = threading.Lock()

    # --- discovery and telemetry -------------------------------------------------------------

    def devices(self) -> tuple[DeviceSpec, ...]:
        """Every device of this backend on this host; discovered once, then cached."""
        if self._devices is None:
            try:
                found = tuple(self._discover())
            except HeteroError:
                raise
            except Exception as err:
                raise BackendError(f"{self.name}: device discovery failed: {err}") from err
            self._devices = found
        return self._devices

    def add_device(self, spec: DeviceSpec) -> None:
        """Know ``spec`` as one of this instance's devices too (a device group a Ray device
        actor opened on its own backend instance: several of the node's GPUs as one device),
        unless a device of its id is known already."""
        known = self.devices()  # discovered first, outside the lock
        with self._lock:
            if all(found.id != spec.id for found in self._devices or known):
                self._devices = (*(self._devices or known), spec)

    def device(self, device_id: str) -> DeviceSpec:
        """The spec of ``device_id``; :class:`UnknownDeviceError` if it is not ours."""
        for spec in self.devices():
            if spec.id == device_id:
                return spec
        raise UnknownDeviceError(device_id)

    def telemetry(self, device_id: str) -> Telemetry:
        """What ``device_id`` is doing now.

        A failure to read it (the device fell off the bus, the driver reset) marks the device
        unhealthy and raises :class:`DeviceUnhealthyError`; the process carries on.
        """
        self.device(device_id)
        try:
            return self._telemetry(device_id)
        except HeteroError:
            raise
        except Exception as err:
            reason = f"telemetry failed: {describe(err)}"
            self.mark_unhealthy(device_id, reason)
            raise DeviceUnhealthyError(device_id, reason) from err

    # --- health ------------------------------------------------------------------------------

    def mark_unhealthy(self, device_id: str, reason: str) -> None:
        """Take ``device_id`` out of placement until :meth:`mark_healthy`."""
        with self._lock:
            if device_id not in self._unhealthy:
                logger.warning("%s: marked unhealthy: %s", device_id, reason)
            self._unhealthy[device_id] = reason

    def mark_healthy(self, device_id: str) -> None:
        """Put ``device_id`` back into placement."""
        with self._lock:
            self._unhealthy.pop(device_id, None)

    def health(self, device_id: str) -> str | None:
        """None when healthy, else why not."""
        with self._lock:
            return self._unhealthy.get(device_id)

    # --- compile, load, run ------------------------------------------------------------------

    def compile(self, graph: ComputeGraph, device_id: str) -> Executable:
        """Prepare ``graph`` for ``device_id`` without making it resident."""
        self.device(device_id)
        try:
            native = self._compile(graph, device_id)
        except HeteroError:
            raise
        except Exception as err:
            raise CompileError(device_id, graph.name, describe(err)) from err
        return Executable(graph=graph, device_id=device_id, native=native)

    def load(self, executable: Executable) -> LoadedModel:
        """Make ``executable`` resident; its memory is accounted until :meth:`unload`."""
        device_id = executable.device_id
        self.device(device_id)
        try:
            native, memory_bytes = self._load(executable)
        except HeteroError:
            raise
        except Exception as err:
            raise CompileError(device_id, executable.graph.name, describe(err)) from err
        model = LoadedModel(
            graph=executable.graph, device_id=device_id, memory_bytes=memory_bytes, native=native
        )
        with self._lock:
            self._loaded[model.handle] = model
        logger.debug("%s: loaded %s (%d bytes)", device_id, executable.graph.name, memory_bytes)
        return model

    def unload(self, model: LoadedModel) -> None:
        """Release ``model``'s memory; unloading twice is a no-op."""
        with self._lock:
            if self._loaded.pop(model.handle, None) is None:
                return
        try:
            self._unload(model)
        except HeteroError:
            raise
        except Exception as err:
            raise BackendError(f"{model.device_id}: unloading {model.graph.name}: {err}") from err
        finally:
            model.native = None

    def run(self, model: LoadedModel, inputs: Arrays) -> RunResult:
        """Run ``model`` on ``inputs`` (name to array); outputs by name, with measured latency."""
        if model.handle not in self._loaded:
            raise ExecutionError(model.device_id, model.graph.name, "model is not loaded")
        started = time.perf_counter()
        try:
            outputs = self._run(model, inputs)
        except HeteroError:
            raise
        except Exception as err:
            raise ExecutionError(model.device_id, model.graph.name, describe(err)) from err
        elapsed = time.perf_counter() - started
        modelled = self._modelled_seconds(model, inputs)
        if modelled is not None:
            elapsed = modelled
        model.latency.record(elapsed, batch_size(inputs))
        return RunResult(outputs=outputs, latency_s=elapsed)

    def accepts(self, graph_format: GraphFormat, device_id: str) -> bool:
        """Whether ``device_id`` runs graphs of ``graph_format``; the scheduler places a
        stage only on devices that accept every graph it has."""
        return graph_format in self.graph_formats

    def run_slots(self, device_id: str, graph_format: GraphFormat) -> int:
        """How many runs of a ``graph_format`` graph ``device_id`` takes at once. 1, the
        default, runs them one after another; an engine with continuous batching (vLLM) takes
        as many generations as it schedules together. The engine's lane for a stage on that
        device runs up to this many plugin calls at the same time, and the scheduler lets
        that many batches be outstanding there."""
        return 1

    def native(self, model: LoadedModel) -> Any:
        """The runtime's own object for a loaded graph (an ONNX Runtime session, an OpenVINO
        compiled model, a torch module on its device): the device-native handle a stage asks
        for when it drives a loop itself (a KV cache)."""
        if model.handle not in self._loaded:
            raise ExecutionError(model.device_id, model.graph.name, "model is not loaded")
        return self._native(model)

    def torch_device(self, device_id: str) -> str | None:
        """The torch device string of ``device_id`` (``cpu``, ``cuda:0``), None where torch
        does not run there."""
        return self._torch_device(device_id)

    def copy(self, array: np.ndarray[Any, Any], src: str, dst: str) -> np.ndarray[Any, Any]:
        """Move ``array`` from device ``src`` to device ``dst`` (both of this backend)."""
        self.device(src)
        self.device(dst)
        try:
            return self._copy(array, src, dst)
        except HeteroError:
            raise
        except Exception as err:
            raise TransferError(src, dst, describe(err)) from err

    def capture(self, model: LoadedModel, example_inputs: Arrays) -> LoadedModel:
        """Capture a static-shape graph for replay; only where ``supports_graph_capture``."""
        if not self.supports_graph_capture:
            raise UnsupportedCapabilityError(f"{self.name}: graph capture is not supported")
        try:
            return self._capture(model, example_inputs)
        except HeteroError:
            raise
        except Exception as err:
            raise ExecutionError(model.device_id, model.graph.name, describe(err)) from err

    def model_host(self, device: DeviceSpec) -> Any:
        """Where ``device``'s models are held and its stages' batches run, when that is not
        this process (an ``engine.device_models.ModelHost``); only where
        ``supports_model_hosts``."""
        raise UnsupportedCapabilityError(f"{self.name}: models are held in this process")

    def poll_membership(self) -> list[DeviceSpec]:
        """Devices that joined since the last call; devices that left are marked unhealthy on
        the way (the engine reads health after each call). Only where
        ``supports_membership``; the default has nothing to report."""
        return []

    # --- accounting --------------------------------------------------------------------------

    def loaded_models(self, device_id: str | None = None) -> tuple[LoadedModel, ...]:
        """Models resident now, on one device or on all."""
        with self._lock:
            models = tuple(self._loaded.values())
        return tuple(m for m in models if device_id is None or m.device_id == device_id)

    def memory_accounted(self, device_id: str) -> int:
        """Bytes of ``device_id``'s memory held by models this backend loaded."""
        return sum(model.memory_bytes for model in self.loaded_models(device_id))

    def close(self) -> None:
        """Unload everything."""
        for model in self.loaded_models():
            self.unload(model)

    # --- hooks for subclasses ----------------------------------------------------------------

    @abc.abstractmethod
    def _discover(self) -> list[DeviceSpec]:
        """Find devices; may touch the runtime, never at import time."""

    @abc.abstractmethod
    def _telemetry(self, device_id: str) -> Telemetry:
        """Read current telemetry of a known device."""

    @abc.abstractmethod
    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        """Return a native prepared object for ``graph`` on ``device_id``."""

    @abc.abstractmethod
    def _load(self, executable: Executable) -> tuple[Any, int]:
        """Make it resident; return the native loaded object and the bytes it holds."""

    @abc.abstractmethod
    def _unload(self, model: LoadedModel) -> None:
        """Release the native object's memory."""

    @abc.abstractmethod
    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        """Run and return outputs by name as host arrays."""

    def _copy(self, array: np.ndarray[Any, Any], src: str, dst: str) -> np.ndarray[Any, Any]:
        """Default for host-memory devices: an independent copy."""
        return np.array(array, copy=True)

    def _native(self, model: LoadedModel) -> Any:
        """The device-native object of a loaded model; by default what :meth:`_load` returned."""
        return model.native

    def _torch_device(self, device_id: str) -> str | None:
        return None

    def _capture(self, model: LoadedModel, example_inputs: Arrays) -> LoadedModel:
        raise UnsupportedCapabilityError(f"{self.name}: graph capture is not implemented")

    def _modelled_seconds(self, model: LoadedModel, inputs: Arrays) -> float | None:
        """A modelling backend's duration for this run, reported instead of wall time."""
        return None


def batch_size(inputs: Arrays) -> int:
    """Items in a run: the leading dimension of the first input with one (1 otherwise)."""
    for array in inputs.values():
        shape = getattr(array, "shape", ())
        if shape:
            return int(shape[0])
    return 1
