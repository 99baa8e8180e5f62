"""gVisor's ``runsc``: a user-space kernel between the sandbox and the host (ptrace platform).

It takes the same OCI bundle with three changes measured on this host kind: no ``uidMappings``
(gVisor puts its sandbox in its own user namespace), the process running as the partition's
host uid instead of a mapped root, and a pids limit large enough for the
sentry's own threads (a limit of 32 crashes it; 4096 works). Its host-side seccomp filters
replace the spec's profile. ``--platform=kvm`` hangs on nested-virtualised hosts, so ptrace is
used.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hetero.sandbox.oci_spec import FULL_ISOLATION, Isolation, SandboxSpec, oci_config
from hetero.sandbox.runtimes.base import (
    Availability,
    IsolationLevel,
    RunOutcome,
    SandboxRuntime,
    completed,
    listed_ids,
)

__all__ = ["GvisorRuntime"]

SENTRY_PIDS = 4096


class GvisorRuntime(SandboxRuntime):
    """``runsc --platform=ptrace --network=none run``."""

    name = "gvisor"
    isolation = IsolationLevel.CONTAINER
    description = "user-space kernel (gVisor sentry, ptrace platform), no network, limits"
    rootfs_path_needs_search = False  # runsc mounts the root as the host's root

    def _command(self) -> list[str]:
        return [
            "runsc",
            "--root",
            str(self.state_dir / "state"),
            "--platform=ptrace",
            "--network=none",
            # the worker's socket is created inside and connected to from the host: gVisor
            # allows that only when told (it opens no other host socket)
            "--host-uds=create",
        ]

    def availability(self) -> Availability:
        if shutil.which("runsc") is None:
            return Availability(False, "runsc not found on PATH", "apt-get install runsc")
        return Availability(True, shutil.which("runsc") or "runsc")

    def config(self, spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION) -> dict[str, object]:
        config = oci_config(spec, isolation)
        linux = config["linux"]
        assert isinstance(linux, dict)
        linux.pop("uidMappings", None)
        linux.pop("gidMappings", None)
        linux["namespaces"] = [n for n in linux["namespaces"] if n["type"] != "user"]
        process = config["process"]
        assert isinstance(process, dict)
        # no mapping: run as the partition's own host uid, which owns the partition directory
        process["user"] = {"uid": spec.host_uid, "gid": spec.host_uid}
        pids = linux["resources"].get("pids")
        if pids is not None:
            pids["limit"] = max(pids["limit"], SENTRY_PIDS)
        return config

    def run(
        self, spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION, timeout_s: float = 60.0
    ) -> RunOutcome:
        self.require()
        bundle = self.bundle(spec, isolation)
        command = [*self._command(), "run", "--bundle", str(bundle), spec.sandbox_id]
        result = self._finish(command, spec.sandbox_id, timeout_s)
        self.stop(spec.sandbox_id)
        return completed(result)

    def start(self, spec: SandboxSpec, log_path: Path) -> subprocess.Popen[bytes]:
        self.require()
        bundle = self.bundle(spec)
        self.stop(spec.sandbox_id)
        # A pipe nobody drains would block a chatty worker; a log file never does. (Measured:
        # with a file, runsc may drop the sandbox's own output; the worker runs regardless.)
        command = [*self._command(), "run", "--bundle", str(bundle), spec.sandbox_id]
        return self._start_logged(command, log_path)

    def leftovers(self) -> list[str]:
        if not (self.state_dir / "state").is_dir():  # listing would create it, 0700
            return []
        return listed_ids([*self._command(), "list", "--format", "json"])

    def stop(self, sandbox_id: str) -> None:
        subprocess.run(
            [*self._command(), "delete", "--force", sandbox_id], capture_output=True, check=False
        )
