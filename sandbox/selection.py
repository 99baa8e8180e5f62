"""Which runtime runs each partition's sandbox: the first available runtime, in the policy's
preference order, that isolates at least as strongly as the partition requires. Nothing weaker
is ever chosen (fail closed); the error says what is missing and how to install it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero.framework import envs
from hetero.framework.errors import HeteroError
from hetero.framework.policy import Policy
from hetero.framework.policy.schema import PartitionConfig, SandboxConfig
from hetero.sandbox.ciphers import SM4_GCM, sm4_gcm_available
from hetero.sandbox.keys import KeyCheck, check_key
from hetero.sandbox.reachability import reach_problems
from hetero.sandbox.rootfs import python_mounts
from hetero.sandbox.runtimes import (
    Availability,
    BwrapRuntime,
    ContainerdRuntime,
    GvisorRuntime,
    IsolationLevel,
    KataRuntime,
    RuncRuntime,
    SandboxRuntime,
)

__all__ = [
    "TEE_DEVICES",
    "IsolationUnsatisfiableError",
    "PartitionCheck",
    "SandboxReport",
    "build_runtimes",
    "check_policy",
    "choose_runtime",
    "tee_devices",
]


class IsolationUnsatisfiableError(HeteroError, RuntimeError):
    """No available runtime gives the isolation a partition requires."""


def build_runtimes(config: SandboxConfig, state_dir: Path | None = None) -> list[SandboxRuntime]:
    """The policy's runtimes, in its preference order."""
    root = state_dir or Path(config.state_dir).expanduser()
    address = Path(config.containerd_address)
    made: dict[str, SandboxRuntime] = {}
    for name in config.runtimes:
        if name == "kata":
            made[name] = KataRuntime(root / "kata", address)
        elif name == "containerd":
            made[name] = ContainerdRuntime(root / "containerd", address)
        elif name == "gvisor":
            made[name] = GvisorRuntime(root / "gvisor")
        elif name == "runc":
            made[name] = RuncRuntime(root / "runc")
        else:
            made[name] = BwrapRuntime(root / "bwrap")
    return list(made.values())


# Device nodes of a confidential-computing host or guest (AMD SEV, Intel TDX and SGX, Hygon CSV)
TEE_DEVICES = (
    "/dev/sev",
    "/dev/sev-guest",
    "/dev/tdx_guest",
    "/dev/tdx-guest",
    "/dev/sgx_enclave",
    "/dev/csv-guest",
)


def tee_devices() -> list[str]:
    """The TEE device nodes present on this host."""
    return [device for device in TEE_DEVICES if Path(device).exists()]


def choose_runtime(
    partition_name: str,
    partition: PartitionConfig,
    runtimes: list[SandboxRuntime],
    availability: dict[str, Availability] | None = None,
) -> SandboxRuntime:
    """The runtime for ``partition``; :class:`IsolationUnsatisfiableError` if none qualifies."""
    required = IsolationLevel.parse(partition.isolation)
    if required is IsolationLevel.TEE:
        devices = tee_devices()
        here = (
            f"this host has {', '.join(devices)}, but no sandbox runtime hetero drives starts "
            "a confidential VM or enclave"
            if devices
            else f"no TEE on this host (none of {', '.join(TEE_DEVICES)})"
        )
        raise IsolationUnsatisfiableError(
            f"partition {partition_name!r} requires tee isolation and will not run on anything "
            f"weaker: {here}; its stages are not served and its keys go to attested "
            "sandboxes only"
        )
    found = availability or {r.name: r.availability() for r in runtimes}
    missing: list[str] = []
    for runtime in runtimes:
        if runtime.isolation < required:
            continue
        state = found[runtime.name]
        if state.available:
            return runtime
        missing.append(
            f"{runtime.name}: {state.detail}" + (f" ({state.hint})" if state.hint else "")
        )
    strong_enough = [r.name for r in runtimes if r.isolation >= required]
    if not strong_enough:
        raise IsolationUnsatisfiableError(
            f"partition {partition_name!r} requires {required.label} isolation and the policy "
            f"lists no runtime that gives it (sandbox.runtimes: {[r.name for r in runtimes]}); "
            + ("add kata" if required is IsolationLevel.VM else "add runc or containerd")
        )
    raise IsolationUnsatisfiableError(
        f"partition {partition_name!r} requires {required.label} isolation and it will not run "
        f"on anything weaker; no runtime that gives it is usable here: " + "; ".join(missing)
    )


@dataclass(frozen=True, slots=True)
class PartitionCheck:
    """Whether one partition can be served here."""

    name: str
    required: str
    runtime: str | None
    key: KeyCheck
    cipher: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Nothing is missing."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``hetero sandbox check --json``."""
        return {
            "name": self.name,
            "requires": self.required,
            "runtime": self.runtime,
            "cipher": self.cipher,
            "key": {"ok": self.key.ok, "detail": self.key.detail},
            "ok": self.ok,
            "problems": list(self.problems),
        }


@dataclass(frozen=True, slots=True)
class SandboxReport:
    """What ``hetero sandbox check`` prints."""

    runtimes: tuple[tuple[SandboxRuntime, Availability], ...]
    partitions: tuple[PartitionCheck, ...]

    @property
    def ok(self) -> bool:
        """Every partition can be satisfied."""
        return all(p.ok for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``hetero sandbox check --json``: runtimes in preference order."""
        return {
            "ok": self.ok,
            "runtimes": [
                {
                    "name": runtime.name,
                    "isolation": runtime.isolation.label,
                    "available": found.available,
                    "detail": found.detail,
                    "hint": found.hint,
                }
                for runtime, found in self.runtimes
            ],
            "partitions": [check.to_dict() for check in self.partitions],
        }


def check_policy(policy: Policy, state_dir: Path | None = None) -> SandboxReport:
    """Probe every runtime and check every partition of ``policy`` against them."""
    config = policy.spec.sandbox
    root = state_dir or Path(config.state_dir).expanduser()
    runtimes = build_runtimes(config, root)
    found = {r.name: r.availability() for r in runtimes}
    mounts = python_mounts(envs.model_cache())  # what a stage's sandbox worker binds
    checks = []
    for name, partition in sorted(policy.spec.partitions.items()):
        problems: list[str] = []
        try:
            chosen = choose_runtime(name, partition, runtimes, found)
        except IsolationUnsatisfiableError as err:
            runtime: str | None = None
            problems.append(str(err))
        else:
            runtime = chosen.name
            problems.extend(reach_problems(chosen, root / "workers", mounts))
        key = check_key(partition.key, config)
        if not key.ok:
            problems.append(f"key {partition.key}: {key.detail}")
        if partition.cipher == SM4_GCM and (missing := sm4_gcm_available()) is not None:
            problems.append(missing)
        checks.append(
            PartitionCheck(
                name, partition.isolation, runtime, key, partition.cipher, tuple(problems)
            )
        )
    return SandboxReport(tuple((r, found[r.name]) for r in runtimes), tuple(checks))
