"""The interface every sandbox runtime implements, and what a run returns."""

from __future__ import annotations

import abc
import enum
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from hetero.framework.errors import HeteroError
from hetero.sandbox.oci_spec import FULL_ISOLATION, Isolation, SandboxSpec, oci_config, write_bundle

__all__ = [
    "Availability",
    "IsolationLevel",
    "RunOutcome",
    "RuntimeMissingError",
    "SandboxRunError",
    "SandboxRuntime",
    "completed",
    "end_process",
]


class IsolationLevel(enum.IntEnum):
    """How strongly a runtime separates a workload from the host (a partition names the least
    it accepts). ``vm``: its own guest kernel; ``container``: namespaces, cgroups, seccomp and a
    user namespace on the host kernel (gVisor adds a user-space kernel but is not a VM);
    ``process``: namespaces without enforced limits; ``tee``: a confidential VM or enclave
    whose memory the host cannot read, proven by hardware attestation (no runtime here gives
    it: a partition that requires it fails closed)."""

    PROCESS = 1
    CONTAINER = 2
    VM = 3
    TEE = 4

    @classmethod
    def parse(cls, name: str) -> IsolationLevel:
        """``"tee"``, ``"vm"``, ``"container"`` or ``"process"``."""
        return cls[name.upper()]

    @property
    def label(self) -> str:
        """The policy's spelling."""
        return self.name.lower()


class SandboxRunError(HeteroError, RuntimeError):
    """A runtime failed to start or run a sandbox."""


class RuntimeMissingError(SandboxRunError):
    """A runtime the policy needs is not installed or cannot work on this host.

    Attributes:
        runtime: Runtime name.
        hint: How to install or enable it.
    """

    def __init__(self, runtime: str, reason: str, hint: str) -> None:
        super().__init__(f"{runtime} is not usable here: {reason}. {hint}")
        self.runtime = runtime
        self.reason = reason
        self.hint = hint


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a runtime can run sandboxes here, and if not why and how to fix it."""

    available: bool
    detail: str
    hint: str = ""


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """A finished sandbox run."""

    returncode: int
    stdout: str
    stderr: str
    oom_killed: bool = False

    @property
    def killed(self) -> bool:
        """Ended by SIGKILL (the memory limit's way of ending a process)."""
        return self.returncode in (137, -9)


class SandboxRuntime(abc.ABC):
    """One way to run an OCI bundle. Subclasses build their command lines from the same
    :func:`~hetero.sandbox.oci_spec.oci_config`; ``state_dir`` holds the runtime's own state.
    """

    name: str
    isolation: IsolationLevel
    description: str
    # What the partition's host uid must reach for a sandbox to start (sandbox/reachability.py):
    # the directories bound in, where the sandbox's processes run as that uid, and every
    # directory down to the root filesystem, where that uid (a user namespace's root) mounts it.
    binds_need_search: ClassVar[bool] = True
    rootfs_path_needs_search: ClassVar[bool] = True

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir  # created on first use: probing availability writes nothing

    @abc.abstractmethod
    def availability(self) -> Availability:
        """Whether this runtime works here (cheap; no sandbox is started)."""

    def config(self, spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION) -> dict[str, object]:
        """The OCI spec this runtime runs for ``spec`` (a runtime may adjust it)."""
        return oci_config(spec, isolation)

    def bundle(self, spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION) -> Path:
        """Write the bundle for ``spec`` under the state directory."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return write_bundle(
            self.state_dir / "bundles" / spec.sandbox_id, self.config(spec, isolation)
        )

    def require(self) -> None:
        """Raise :class:`RuntimeMissingError` unless available."""
        found = self.availability()
        if not found.available:
            raise RuntimeMissingError(self.name, found.detail, found.hint)

    @abc.abstractmethod
    def run(
        self, spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION, timeout_s: float = 60.0
    ) -> RunOutcome:
        """Run ``spec`` to completion and collect its output."""

    def _finish(
        self, command: list[str], sandbox_id: str, timeout_s: float
    ) -> subprocess.CompletedProcess[str]:
        """Run a sandbox's command to its end with captured output; on timeout, remove the
        sandbox and raise :class:`SandboxRunError`."""
        try:
            return subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            self.stop(sandbox_id)
            raise SandboxRunError(
                f"{self.name} sandbox {sandbox_id} did not finish in {timeout_s:g} s"
            ) from err

    def _start_logged(self, command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        """Start a long-lived sandbox whose output (stdout and stderr) goes to ``log_path``."""
        with log_path.open("ab") as log:
            return subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    @abc.abstractmethod
    def start(self, spec: SandboxSpec, log_path: Path) -> subprocess.Popen[bytes]:
        """Start ``spec`` as a long-lived sandbox; its output goes to ``log_path``."""

    def leftovers(self) -> list[str]:
        """The ids of hetero's sandboxes this runtime's state still lists (running or not);
        empty for a runtime that keeps no state between processes."""
        return []

    @abc.abstractmethod
    def stop(self, sandbox_id: str) -> None:
        """Kill and remove a sandbox started with :meth:`start` (no error if already gone)."""


def listed_ids(command: list[str]) -> list[str]:
    """The ``hetero-`` container ids a runc-style ``list --format json`` prints (``null`` when
    there are none); empty when the command fails (no state yet)."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return []
    try:
        entries = json.loads(result.stdout or "null") or []
    except json.JSONDecodeError:
        return []
    ids = (entry.get("id") for entry in entries if isinstance(entry, dict))
    return sorted(i for i in ids if isinstance(i, str) and i.startswith("hetero-"))


def completed(result: subprocess.CompletedProcess[str], oom_killed: bool = False) -> RunOutcome:
    """A :class:`RunOutcome` from a finished subprocess."""
    return RunOutcome(result.returncode, result.stdout, result.stderr, oom_killed)


def end_process(
    process: subprocess.Popen[bytes], *, terminate: bool, grace_s: float = 10.0
) -> None:
    """Wait for ``process`` to end (after SIGTERM when ``terminate``), SIGKILL after ``grace_s``."""
    if terminate:
        process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
