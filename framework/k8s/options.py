"""What ``hetero deploy k8s`` is told besides the policy: names, image, sizes, accelerators."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from hetero.framework.errors import HeteroError

__all__ = [
    "ACCELERATORS",
    "Accelerator",
    "DeployError",
    "KubeOptions",
    "parse_accelerator",
]

Engine = Literal["embedded", "ray"]


class DeployError(HeteroError, ValueError):
    """A wrong ``hetero deploy k8s`` argument (the CLI exits 2)."""


@dataclass(frozen=True, slots=True)
class Accelerator:
    """A kind of accelerator a pod asks the device plugin for.

    Attributes:
        kind: The short name given on the command line (``nvidia``).
        device_class: The policy's device class its devices have (``cuda``).
        resource: The extended resource its Kubernetes device plugin advertises.
    """

    kind: str
    device_class: str
    resource: str


# The device plugins' resource names: NVIDIA's k8s-device-plugin, AMD's ROCm k8s-device-plugin,
# Huawei's Ascend device plugin (one name per chip model).
ACCELERATORS: dict[str, Accelerator] = {
    a.kind: a
    for a in (
        Accelerator("nvidia", "cuda", "nvidia.com/gpu"),
        Accelerator("amd", "rocm", "amd.com/gpu"),
        Accelerator("ascend910", "npu", "huawei.com/Ascend910"),
        Accelerator("ascend310p", "npu", "huawei.com/Ascend310P"),
    )
}


def parse_accelerator(text: str) -> tuple[Accelerator, int]:
    """``KIND=COUNT`` (``nvidia=2``) as the accelerator and how many one pod asks for."""
    kind, sep, count = text.partition("=")
    accelerator = ACCELERATORS.get(kind.strip().lower())
    if accelerator is None:
        raise DeployError(
            f"--accelerator {text!r}: unknown kind {kind!r}; one of {', '.join(ACCELERATORS)}"
        )
    if not sep or not re.fullmatch(r"[1-9][0-9]*", count.strip()):
        raise DeployError(f"--accelerator {text!r}: expected KIND=COUNT with a count >= 1")
    return accelerator, int(count)


@dataclass(frozen=True, slots=True)
class KubeOptions:
    """Everything but the policy that the rendered manifests depend on.

    Attributes:
        name: The release name: every object's name starts with it.
        namespace: Where the namespaced objects go (a Namespace object is rendered for it).
        image: The hetero container image (built from the air-gapped bundle, pushed to the
            site's registry).
        engine: ``embedded`` (one Deployment) or ``ray`` (a KubeRay RayCluster); by default
            the policy's ``cluster.engine``.
        accelerators: Per pod (the Deployment, or each Ray worker), the accelerators asked for.
        workers: Ray worker pods per accelerator group (Ray mode only).
        storage_class: StorageClass of the state and disk-tier volumes (None: the default).
        partition_storage_class: StorageClass of the partition volumes; an encrypting class
            (keyed per volume) is what sensitive partitions should get.
        partition_size: Size of each partition volume (a Kubernetes quantity).
    """

    name: str = "hetero"
    namespace: str = "hetero"
    image: str = "localhost/hetero:latest"
    engine: Engine | None = None
    accelerators: tuple[tuple[Accelerator, int], ...] = field(default=())
    workers: int = 1
    storage_class: str | None = None
    partition_storage_class: str | None = None
    partition_size: str = "10Gi"

    def __post_init__(self) -> None:
        for label, value in (("--name", self.name), ("--namespace", self.namespace)):
            # RFC 1123 labels; the release name leaves room for the suffixes added to it.
            limit = 40 if label == "--name" else 63
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value) or len(value) > limit:
                raise DeployError(
                    f"{label} {value!r}: lower-case letters, digits and '-', at most {limit} "
                    "characters, starting and ending with a letter or digit"
                )
        if self.workers < 1:
            raise DeployError(f"--workers: at least 1, got {self.workers}")
        kinds = [accelerator.kind for accelerator, _ in self.accelerators]
        if len(set(kinds)) != len(kinds):
            raise DeployError("--accelerator: each kind at most once")
        if not re.fullmatch(
            r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?", self.partition_size
        ):
            raise DeployError(
                f"--partition-size {self.partition_size!r}: a Kubernetes quantity such as 10Gi"
            )
