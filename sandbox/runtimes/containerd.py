"""containerd with a shim (runc's by default), driven through ``ctr``, and a private daemon.

``ctr run --rm --config config.json ID`` runs the very spec the runc driver writes; only the
shim differs between runc, Kata and others, so this driver is also the Kata driver's code path
(:mod:`hetero.sandbox.runtimes.kata`). The daemon is the site's own (``address``) or one this
process starts from a private configuration (:class:`ContainerdDaemon`), which is what tests and
hosts without systemd use.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from hetero.sandbox.oci_spec import FULL_ISOLATION, Isolation, SandboxSpec
from hetero.sandbox.runtimes.base import (
    Availability,
    IsolationLevel,
    RunOutcome,
    RuntimeMissingError,
    SandboxRunError,
    SandboxRuntime,
    completed,
    end_process,
)

__all__ = ["ContainerdDaemon", "ContainerdRuntime", "ShimMissingError"]

RUNC_SHIM = "io.containerd.runc.v2"
NAMESPACE = "hetero"
DAEMON_START_S = 15.0
_SHIM_MISSING = re.compile(r'binary not installed "containerd-shim-([a-z0-9.-]+)"')
_CONFIG = """version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{address}"
[ttrpc]
  address = "{address}.ttrpc"
"""


class ShimMissingError(RuntimeMissingError):
    """containerd has no binary for the requested shim; the message carries containerd's text."""


class ContainerdDaemon:
    """A containerd started from a private config under ``directory``, stopped by PID.

    ``extra_path`` directories are put in front of containerd's ``PATH``: containerd resolves a
    runtime name such as ``io.containerd.kata.v2`` to ``containerd-shim-kata-v2`` on *its* PATH.
    """

    def __init__(self, directory: Path, extra_path: tuple[Path, ...] = ()) -> None:
        self.directory = directory
        self.address = directory / "containerd.sock"
        self.extra_path = extra_path
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> ContainerdDaemon:
        """Start the daemon and wait until its socket answers."""
        if shutil.which("containerd") is None:
            raise RuntimeMissingError(
                "containerd", "containerd not found on PATH", "apt-get install containerd"
            )
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        config = self.directory / "config.toml"
        config.write_text(
            _CONFIG.format(
                root=self.directory / "root", state=self.directory / "state", address=self.address
            )
        )
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([*map(str, self.extra_path), env.get("PATH", "")])
        log = (self.directory / "containerd.log").open("ab")
        self._process = subprocess.Popen(
            ["containerd", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + DAEMON_START_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise SandboxRunError(
                    f"containerd exited with {self._process.returncode}; "
                    f"see {self.directory / 'containerd.log'}"
                )
            if _answers(self.address):
                return self
            time.sleep(0.02)
        self.stop()
        raise SandboxRunError(f"containerd did not open {self.address} in {DAEMON_START_S:g} s")

    def stop(self) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL after 10 s)."""
        if self._process is None:
            return
        end_process(self._process, terminate=True)
        self._process = None

    def __enter__(self) -> ContainerdDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers(address: Path) -> bool:
    if not address.exists():
        return False
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(address))
        except OSError:
            return False
    return True


class ContainerdRuntime(SandboxRuntime):
    """``ctr run --rm --runtime SHIM --config config.json ID`` against ``address``."""

    name = "containerd"
    isolation = IsolationLevel.CONTAINER
    description = "containerd + runc shim: namespaces, cgroup limits, seccomp, user namespace"
    shim = RUNC_SHIM

    def __init__(self, state_dir: Path, address: Path) -> None:
        super().__init__(state_dir)
        self.address = address

    def _ctr(self) -> list[str]:
        return ["ctr", "--address", str(self.address), "--namespace", NAMESPACE]

    def availability(self) -> Availability:
        if shutil.which("ctr") is None:
            return Availability(False, "ctr not found on PATH", "apt-get install containerd")
        if not _answers(self.address):
            return Availability(
                False,
                f"no containerd answers at {self.address}",
                "start containerd (or set sandbox.containerd_address in the policy)",
            )
        return Availability(True, f"containerd at {self.address}, shim {self.shim}")

    def _run_command(self, spec: SandboxSpec, bundle: Path, remove: bool) -> list[str]:
        command = [*self._ctr(), "run"]
        if remove:
            command.append("--rm")
        command += ["--runtime", self.shim]
        for key, value in sorted(spec.annotations.items()):
            command += ["--annotation", f"{key}={value}"]
        return [*command, "--config", str(bundle / "config.json"), spec.sandbox_id]

    def _translate(self, stderr: str) -> None:
        missing = _SHIM_MISSING.search(stderr)
        if missing is not None:
            raise self._shim_missing(stderr.strip(), f"containerd-shim-{missing.group(1)}")

    def _shim_missing(self, text: str, binary: str) -> ShimMissingError:
        return ShimMissingError(
            self.name, f"containerd says: {text}", f"install {binary} on containerd's PATH"
        )

    def run(
        self, spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION, timeout_s: float = 60.0
    ) -> RunOutcome:
        self.require()
        bundle = self.bundle(spec, isolation)
        command = self._run_command(spec, bundle, remove=True)
        result = self._finish(command, spec.sandbox_id, timeout_s)
        if result.returncode != 0:
            self._translate(result.stderr)
        return completed(result)

    def start(self, spec: SandboxSpec, log_path: Path) -> subprocess.Popen[bytes]:
        self.require()
        bundle = self.bundle(spec)
        self.stop(spec.sandbox_id)
        return self._start_logged(self._run_command(spec, bundle, remove=True), log_path)

    def stop(self, sandbox_id: str) -> None:
        for command in (
            ["task", "kill", "--signal", "SIGKILL", sandbox_id],
            ["task", "delete", "--force", sandbox_id],
            ["container", "delete", sandbox_id],
        ):
            subprocess.run([*self._ctr(), *command], capture_output=True, check=False, timeout=30)
