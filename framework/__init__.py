"""hetero's core: the public API, re-exported from the modules that define it.

Importing this package imports no backend or vendor library (torch, openvino, onnxruntime,
pynvml, amdsmi); those load inside the backend that needs them.
"""

from hetero.framework.backend import Backend, Executable, LoadedModel, RunResult
from hetero.framework.devices import DeviceClass, DeviceSpec, Link, LinkKind, Telemetry
from hetero.framework.errors import HeteroError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import Policy, PolicyStore, load_policy
from hetero.framework.registry import Detection, Registry, default_registry
from hetero.framework.stages import Modality, Pipeline, PipelineStep, Request, Stage

__all__ = [
    "Backend",
    "BandwidthHint",
    "ComputeGraph",
    "Detection",
    "DeviceClass",
    "DeviceSpec",
    "Executable",
    "GraphFormat",
    "HeteroError",
    "Link",
    "LinkKind",
    "LoadedModel",
    "Modality",
    "Pipeline",
    "PipelineStep",
    "Policy",
    "PolicyStore",
    "Registry",
    "Request",
    "RunResult",
    "Stage",
    "Telemetry",
    "default_registry",
    "load_policy",
]
