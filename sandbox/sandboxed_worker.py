"""The orchestrator's side of a sandbox worker: start it, send it objects, restart it if it dies.

One :class:`SandboxedWorker` per partition. It builds the sandbox from the shared OCI spec (the
Python runtime bound read-only, the partition at ``/data``, a private socket directory), waits
for the worker's socket, then for each request unwraps the object's data key (in the HSM when
the key provider is PKCS#11) and sends only that key and the object id. A worker that dies
mid-request is reported with what killed it, restarted, and the object stays intact on disk.
Once started, the worker holds a lifeline connection from this process: when this process ends,
however it ends, the kernel closes it and the worker (the sandbox's init) exits.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero.framework.errors import HeteroError, InvalidInputError
from hetero.sandbox.envelope import unwrap_data_key
from hetero.sandbox.keyring import KeyProvider
from hetero.sandbox.oci_spec import SOCKET_DIR, SandboxSpec
from hetero.sandbox.reachability import reach_problems
from hetero.sandbox.rootfs import ensure_mountpoints, python_mounts, python_rootfs
from hetero.sandbox.runtimes.base import SandboxRunError, SandboxRuntime, end_process
from hetero.sandbox.wire import WireError, receive, send

__all__ = ["SandboxWorkerError", "SandboxedWorker", "WorkerDiedError", "WorkerLimits"]

START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 300.0


class SandboxWorkerError(HeteroError, RuntimeError):
    """The worker refused a request (bad object, failed decryption, handler error)."""


class WorkerDiedError(SandboxWorkerError):
    """The worker process ended while a request was in flight; it has been restarted."""


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """Resource limits of a worker sandbox."""

    memory_bytes: int = 1 * 2**30
    pids: int = 256
    cpus: float = 1.0
    tmpfs_bytes: int = 64 * 2**20


class SandboxedWorker:
    """A long-lived worker for one partition inside ``runtime``.

    Args:
        runtime: Where it runs (runc, containerd, Kata, gVisor).
        partition: Partition name (the envelope binding).
        partition_dir: The partition's directory on the host; the only data mounted.
        keyring: Unwraps per-object data keys.
        work_dir: Private directory for the root skeleton, socket and log.
        host_uid: First host uid of the sandbox's user namespace; the partition and socket
            directories are owned by it, so no other partition's sandbox can read them.
        handler: ``digest`` or ``stage:NAME``.
        extra_mounts: Further read-only paths the worker needs (model files).
        extra_env: Further ``NAME=value`` environment entries for the worker.
    """

    def __init__(
        self,
        runtime: SandboxRuntime,
        partition: str,
        partition_dir: Path,
        keyring: KeyProvider,
        work_dir: Path,
        *,
        host_uid: int = 100_000,
        handler: str = "digest",
        limits: WorkerLimits = WorkerLimits(),
        extra_mounts: tuple[Path, ...] = (),
        extra_env: tuple[str, ...] = (),
    ) -> None:
        self.runtime = runtime
        self.partition = partition
        self.partition_dir = partition_dir
        self.keyring = keyring
        self.work_dir = work_dir
        self.host_uid = host_uid
        self.handler = handler
        self.limits = limits
        self.extra_mounts = extra_mounts
        self.mounts = python_mounts(*extra_mounts)  # read-only binds of the Python runtime
        self.extra_env = extra_env
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._lifeline: socket.socket | None = None
        self._lock = threading.Lock()
        self._generation = 0

    @property
    def sandbox_id(self) -> str:
        """The id of the current sandbox (changes on restart)."""
        # the work directory names the stage: two stages on one partition get two sandboxes
        return f"hetero-{self.partition}-{self.work_dir.name}-{os.getpid()}-{self._generation}"

    @property
    def socket_path(self) -> Path:
        """The worker's socket as the host sees it."""
        return self.work_dir / "socket" / "worker.sock"

    @property
    def log_path(self) -> Path:
        """The sandbox's output (object ids and sizes only, never content)."""
        return self.work_dir / "worker.log"

    def spec(self) -> SandboxSpec:
        """The sandbox this worker runs in."""
        if any(self.partition_dir.is_relative_to(m.source) for m in self.mounts):
            raise SandboxRunError(
                f"partition directory {self.partition_dir} lies inside a path the sandbox "
                "mounts for its Python runtime: keep partitions outside the installation"
            )
        return SandboxSpec(
            sandbox_id=self.sandbox_id,
            rootfs=self.work_dir / "rootfs",
            args=(
                sys.executable,
                "-m",
                "hetero.sandbox.worker",
                "--partition",
                self.partition,
                "--handler",
                self.handler,
                "--socket",
                f"{SOCKET_DIR}/worker.sock",
            ),
            partition_dir=self.partition_dir,
            socket_dir=self.socket_path.parent,
            mounts=self.mounts,
            env=(
                f"PATH={Path(sys.executable).parent}:/usr/bin:/bin",
                "HOME=/tmp",
                "PYTHONSAFEPATH=1",
                "PYTHONDONTWRITEBYTECODE=1",
                "OMP_NUM_THREADS=1",
                "HF_HUB_OFFLINE=1",
                *self.extra_env,
            ),
            memory_bytes=self.limits.memory_bytes,
            pids=self.limits.pids,
            cpus=self.limits.cpus,
            tmpfs_bytes=self.limits.tmpfs_bytes,
            host_uid=self.host_uid,
        )

    def _prepare_dirs(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.chmod(0o711)  # the user namespace's root must reach rootfs and socket
        ensure_mountpoints(python_rootfs(self.work_dir / "rootfs"), self.mounts)
        self.socket_path.parent.mkdir(exist_ok=True, mode=0o700)
        self.socket_path.unlink(missing_ok=True)
        for path in (self.socket_path.parent, self.partition_dir):
            os.chown(path, self.host_uid, self.host_uid)
            path.chmod(0o700)
        for entry in self.partition_dir.iterdir():
            os.chown(entry, self.host_uid, self.host_uid)

    def check_reach(self) -> None:
        """Raise :class:`SandboxRunError` naming each directory the partition's uid could not
        reach to start this sandbox, with its fix (:mod:`hetero.sandbox.reachability`)."""
        problems = reach_problems(self.runtime, self.work_dir / "rootfs", self.mounts)
        if problems:
            raise SandboxRunError(
                f"the {self.runtime.name} sandbox for partition {self.partition} cannot start: "
                + "; ".join(problems)
            )

    def start(self) -> SandboxedWorker:
        """Start the sandbox and wait until the worker answers a ping."""
        with self._lock:
            self._start_locked()
        return self

    def _start_locked(self) -> None:
        self._prepare_dirs()
        self.check_reach()
        self._process = self.runtime.start(self.spec(), self.log_path)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise SandboxRunError(
                    f"the {self.runtime.name} sandbox for partition {self.partition} exited "
                    f"with {self._process.returncode} while starting: {self._log_tail()}"
                )
            if self.socket_path.exists():
                try:
                    self._call({"op": "ping"}, timeout_s=10.0)
                    self._lifeline = self._open_lifeline()
                    return
                except (OSError, WireError):
                    pass
            time.sleep(0.05)
        self._stop_locked()
        raise SandboxRunError(
            f"the sandbox for partition {self.partition} did not answer within "
            f"{START_TIMEOUT_S:g} s: {self._log_tail()}"
        )

    def _open_lifeline(self) -> socket.socket:
        """The connection the worker exits on when it closes (kept open until :meth:`stop`;
        not inherited by child processes, so only this process's end keeps it open)."""
        connection = socket.socket(socket.AF_UNIX)
        try:
            connection.settimeout(10.0)
            connection.connect(str(self.socket_path))
            send(connection, {"op": "lifeline"})
            answer = receive(connection)
        except (OSError, WireError):
            connection.close()
            raise
        if not answer.get("ok"):
            connection.close()
            raise SandboxRunError(f"the worker for partition {self.partition} took no lifeline")
        return connection

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-3:]) or "(empty log)"

    def _call(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX) as connection:
            connection.settimeout(timeout_s)
            connection.connect(str(self.socket_path))
            send(connection, message)
            return receive(connection)

    def process(self, object_id: str, variant: str = "full") -> dict[str, Any]:
        """Run the handler on one object of the partition inside the sandbox; its result."""
        path = self.partition_dir / object_id
        blob = path.read_bytes()
        if path.stat().st_uid != self.host_uid:  # stored after the sandbox started
            os.chown(path, self.host_uid, self.host_uid)
        data_key = unwrap_data_key(self.keyring, self.partition, object_id, blob)
        request = {
            "op": "process",
            "object": object_id,
            "data_key": base64.b64encode(data_key).decode(),
            "variant": variant,
        }
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._restart_locked()
            try:
                answer = self._call(request, REQUEST_TIMEOUT_S)
            except (OSError, WireError) as err:
                cause = self._death_cause(err)
                self._restart_locked()
                raise WorkerDiedError(
                    f"the sandbox worker for partition {self.partition} died while processing "
                    f"object {object_id!r} ({cause}); it was restarted and the object is intact"
                ) from None
        if not answer.get("ok"):
            message = str(answer.get("error", "worker refused the request"))
            if answer.get("kind") == "invalid_input":
                raise InvalidInputError(message)
            raise SandboxWorkerError(message)
        result = answer.get("result", {})
        return result if isinstance(result, dict) else {"result": result}

    def _death_cause(self, err: BaseException) -> str:
        process = self._process
        if process is not None:
            try:
                code = process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                return f"connection lost: {err}"
            if code in (137, -9):
                return f"killed (exit {code}; the memory limit is {self.limits.memory_bytes} bytes)"
            return f"exit {code}"
        return str(err)

    def _restart_locked(self) -> None:
        self._stop_locked()
        self.restarts += 1
        self._generation += 1
        self._start_locked()

    def stop(self) -> None:
        """Stop the sandbox."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None
        self.runtime.stop(self.sandbox_id)
        if self._process is not None:
            end_process(self._process, terminate=False)
            self._process = None

    def __enter__(self) -> SandboxedWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
