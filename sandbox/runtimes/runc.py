"""runc, driven directly: the reference container runtime, tested for real on CI hosts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hetero.sandbox.oci_spec import FULL_ISOLATION, Isolation, SandboxSpec
from hetero.sandbox.runtimes.base import (
    Availability,
    IsolationLevel,
    RunOutcome,
    SandboxRuntime,
    listed_ids,
)
from hetero.sandbox.runtimes.cgroups import oom_kills

__all__ = ["RuncRuntime"]


class RuncRuntime(SandboxRuntime):
    """``runc run`` on a bundle written from the shared OCI spec."""

    name = "runc"
    isolation = IsolationLevel.CONTAINER
    description = "namespaces, cgroup limits, seccomp, user namespace (host kernel)"
    binary = "runc"

    def _command(self) -> list[str]:
        return [self.binary, "--root", str(self.state_dir / "state")]

    def availability(self) -> Availability:
        path = shutil.which(self.binary)
        if path is None:
            return Availability(False, f"{self.binary} not found on PATH", "apt-get install runc")
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()
        return Availability(True, version[0] if version else path)

    def run(
        self, spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION, timeout_s: float = 60.0
    ) -> RunOutcome:
        self.require()
        bundle = self.bundle(spec, isolation)
        command = [*self._command(), "run", "--keep", "--bundle", str(bundle), spec.sandbox_id]
        result = self._finish(command, spec.sandbox_id, timeout_s)
        kills = oom_kills(f"hetero-sandbox/{spec.sandbox_id}") if isolation.limits else None
        self.stop(spec.sandbox_id)
        return RunOutcome(result.returncode, result.stdout, result.stderr, bool(kills))

    def start(self, spec: SandboxSpec, log_path: Path) -> subprocess.Popen[bytes]:
        self.require()
        bundle = self.bundle(spec)
        self.stop(spec.sandbox_id)
        return self._start_logged(
            [*self._command(), "run", "--bundle", str(bundle), spec.sandbox_id], log_path
        )

    def leftovers(self) -> list[str]:
        if not (self.state_dir / "state").is_dir():  # listing would create it, 0700
            return []
        return listed_ids([*self._command(), "list", "--format", "json"])

    def stop(self, sandbox_id: str) -> None:
        subprocess.run(
            [*self._command(), "delete", "--force", sandbox_id],
            capture_output=True,
            check=False,
        )
