"""bubblewrap: namespaces and a read-only root for development machines without runc.

It reads the same OCI spec (its mounts, program and environment) and gives process-level
isolation only: bwrap enforces no memory, pids or CPU limits and takes seccomp only as compiled
BPF, so a partition that requires ``container`` or ``vm`` never runs here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from hetero.sandbox.oci_spec import FULL_ISOLATION, Isolation, SandboxSpec
from hetero.sandbox.runtimes.base import (
    Availability,
    IsolationLevel,
    RunOutcome,
    SandboxRuntime,
    completed,
)

__all__ = ["BwrapRuntime", "bwrap_arguments"]


def bwrap_arguments(config: dict[str, Any]) -> list[str]:
    """A bwrap command line equivalent to an OCI spec's namespaces, mounts and program."""
    process = config["process"]
    namespaces = {n["type"] for n in config["linux"]["namespaces"]}
    args = ["bwrap", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    args += ["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts"]
    if "network" in namespaces:
        args.append("--unshare-net")
    root_flag = "--ro-bind" if config["root"]["readonly"] else "--bind"
    args += [root_flag, config["root"]["path"], "/", "--proc", "/proc", "--dev", "/dev"]
    for mount in config["mounts"]:
        if mount["type"] == "tmpfs" and mount["destination"] == "/tmp":
            args += ["--tmpfs", "/tmp"]
        elif mount["type"] == "bind":
            flag = "--bind" if "rw" in mount["options"] else "--ro-bind"
            args += [flag, mount["source"], mount["destination"]]
    for entry in process["env"]:
        key, _, value = entry.partition("=")
        args += ["--setenv", key, value]
    return [*args, "--chdir", process["cwd"], "--", *process["args"]]


class BwrapRuntime(SandboxRuntime):
    """``bwrap`` from the spec; no limits (process isolation)."""

    name = "bwrap"
    isolation = IsolationLevel.PROCESS
    description = "namespaces and read-only root only: no limits, no seccomp (development)"
    # runs as the calling user (mapped to itself), not as the partition's uid
    binds_need_search = False
    rootfs_path_needs_search = False

    def availability(self) -> Availability:
        if shutil.which("bwrap") is None:
            return Availability(False, "bwrap not found on PATH", "apt-get install bubblewrap")
        return Availability(True, shutil.which("bwrap") or "bwrap")

    def run(
        self, spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION, timeout_s: float = 60.0
    ) -> RunOutcome:
        self.require()
        command = bwrap_arguments(self.config(spec, isolation))
        return completed(self._finish(command, spec.sandbox_id, timeout_s))

    def start(self, spec: SandboxSpec, log_path: Path) -> subprocess.Popen[bytes]:
        self.require()
        return self._start_logged(bwrap_arguments(self.config(spec)), log_path)

    def stop(self, sandbox_id: str) -> None:
        """bwrap sandboxes end with their process (``--die-with-parent``); nothing to remove."""
