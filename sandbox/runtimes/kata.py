"""Kata Containers through containerd's ``io.containerd.kata.v2`` shim: each sandbox in its own
lightweight VM with its own guest kernel.

The driver is the containerd driver with another shim name, Kata's per-sandbox sizing
annotations (``io.katacontainers.config.hypervisor.default_memory`` in MiB and ``default_vcpus``;
the Kata configuration must allow-list them in ``enable_annotations``), and a host check through
``kata-runtime check --no-network-checks``. Where Kata is absent, containerd's own text is kept in
the error (``binary not installed "containerd-shim-kata-v2"``) and the hint says what to install.
Tests on hosts without KVM point the shim name at the runc shim: that proves the command line
and lifecycle, not VM isolation.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

from hetero.sandbox.oci_spec import FULL_ISOLATION, Isolation, SandboxSpec
from hetero.sandbox.runtimes.base import Availability, IsolationLevel
from hetero.sandbox.runtimes.containerd import ContainerdRuntime, ShimMissingError

__all__ = ["KATA_SHIM", "KataNotInstalledError", "KataRuntime", "kata_annotations"]

KATA_SHIM = "io.containerd.kata.v2"
MEMORY_ANNOTATION = "io.katacontainers.config.hypervisor.default_memory"
VCPU_ANNOTATION = "io.katacontainers.config.hypervisor.default_vcpus"
INSTALL_HINT = (
    "Install Kata Containers 3.x (the static release under /opt/kata), put "
    "containerd-shim-kata-v2 on containerd's PATH, allow-list the default_memory and "
    "default_vcpus annotations in enable_annotations, and confirm with "
    "`kata-runtime check --no-network-checks` (needs a host with usable KVM: vmx/svm, vhost, "
    "vhost_net)"
)


class KataNotInstalledError(ShimMissingError):
    """Kata is not installed where containerd looks for it; the message starts with
    ``Kata not installed:`` and keeps containerd's own words."""

    def __init__(self, runtime: str, reason: str, hint: str) -> None:
        super().__init__(runtime, reason, hint)
        self.args = (f"Kata not installed: {reason}. {hint}",)


def kata_annotations(spec: SandboxSpec) -> dict[str, str]:
    """The VM sizing annotations for ``spec``: memory in MiB, vCPUs rounded up."""
    return {
        MEMORY_ANNOTATION: str(max(spec.memory_bytes // 2**20, 128)),
        VCPU_ANNOTATION: str(max(1, int(-(-spec.cpus // 1)))),
    }


class KataRuntime(ContainerdRuntime):
    """``ctr run --runtime io.containerd.kata.v2`` with Kata's sizing annotations.

    ``check_host=False`` skips ``kata-runtime check``; only the plumbing test uses it.
    """

    name = "kata"
    isolation = IsolationLevel.VM
    description = "Kata Containers: a lightweight VM per sandbox (own guest kernel)"
    shim = KATA_SHIM

    def __init__(self, state_dir: Path, address: Path, *, check_host: bool = True) -> None:
        super().__init__(state_dir, address)
        self.check_host = check_host

    def config(self, spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION) -> dict[str, object]:
        return super().config(_with_annotations(spec), isolation)

    def _run_command(self, spec: SandboxSpec, bundle: Path, remove: bool) -> list[str]:
        return super()._run_command(_with_annotations(spec), bundle, remove)

    def availability(self) -> Availability:
        if self.check_host:
            if shutil.which("kata-runtime") is None:
                return Availability(False, "kata-runtime not found on PATH", INSTALL_HINT)
            check = subprocess.run(
                ["kata-runtime", "check", "--no-network-checks"],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            if check.returncode != 0:
                lines = (check.stdout + check.stderr).strip().splitlines()
                return Availability(
                    False, lines[-1] if lines else "kata-runtime check failed", INSTALL_HINT
                )
        found = super().availability()
        version = kata_version() if self.check_host else None
        if found.available and version is not None:
            return Availability(True, f"Kata {version}; {found.detail}")
        return found

    def _shim_missing(self, text: str, binary: str) -> ShimMissingError:
        return KataNotInstalledError("kata", f"containerd says: {text}", INSTALL_HINT)


def kata_version() -> str | None:
    """Kata's version from ``kata-runtime env --json`` (``Runtime.Version.Version.Semver``)."""
    try:
        env = subprocess.run(
            ["kata-runtime", "env", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        semver = json.loads(env.stdout)["Runtime"]["Version"]["Version"]["Semver"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return None
    return str(semver)


def _with_annotations(spec: SandboxSpec) -> SandboxSpec:
    return replace(spec, annotations={**kata_annotations(spec), **spec.annotations})
