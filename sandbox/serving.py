"""Running a policy's sensitive stages inside their partition's sandbox, through the engine.

For a stage with a ``partition``, :class:`SandboxedStages` gives the engine a stage plugin
(:class:`SandboxedStage`) placed only on that partition's sandbox device
(:mod:`hetero.sandbox.device`): each input is sealed into the partition under a fresh data key
and handed to the partition's long-lived sandbox worker, which decrypts it and runs the real
model inside. The runtime is chosen fail-closed from the policy
(:func:`~hetero.sandbox.selection.choose_runtime`); a stage whose partition cannot be satisfied
is not served at all. Sandbox starts and stops and every key use are audited through the
:class:`~hetero.sandbox.gate.ComplianceGate`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from hetero.framework import envs
from hetero.framework.data_subject import SubjectData
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.policy import Policy
from hetero.framework.registry import Registry
from hetero.framework.stage_plugin import GraphRunner, StagePlugin, each
from hetero.sandbox.audit import AuditLog, load_or_create_signing_key, parse_anchor
from hetero.sandbox.device import register_sandbox_devices, sandbox_device
from hetero.sandbox.gate import ComplianceGate
from hetero.sandbox.keys import open_key
from hetero.sandbox.partition_store import PartitionStore
from hetero.sandbox.reaping import reap_leftovers
from hetero.sandbox.runtimes import SandboxRuntime
from hetero.sandbox.sandboxed_worker import SandboxedWorker, WorkerLimits
from hetero.sandbox.selection import build_runtimes, choose_runtime

__all__ = ["SandboxedStage", "SandboxedStages", "SubjectData", "build_gate"]

FIRST_HOST_UID = 100_000
UID_RANGE = 65_536
SANDBOXED_KINDS = ("ocr", "asr")


def build_gate(policy: Policy) -> ComplianceGate:
    """The policy's compliance gate, with its audit log opened (created on first use)."""
    audit = policy.spec.audit
    path = Path(audit.path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_path = Path(audit.signing_key).expanduser()
    key_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = AuditLog(
        path,
        load_or_create_signing_key(key_path),
        algorithm=audit.hash,
        checkpoint_every=audit.checkpoint_every,
        checkpoint_interval_s=audit.checkpoint_interval_s,
        anchor=parse_anchor(audit.anchor),
    )
    return ComplianceGate(policy, log)


class SandboxedStages:
    """Model classes that run a policy's sensitive stages in their partitions' sandboxes."""

    def __init__(self, policy: Policy, gate: ComplianceGate) -> None:
        self.policy = policy
        self.gate = gate
        config = policy.spec.sandbox
        self.runtimes = build_runtimes(config)
        self.partitions_dir = Path(config.partitions_dir).expanduser()
        self.state_dir = Path(config.state_dir).expanduser()
        self.limits = WorkerLimits(
            memory_bytes=config.worker_memory, pids=config.worker_pids, cpus=config.worker_cpus
        )
        self.model_cache = envs.model_cache()  # bound read-only into each worker
        self.model_cache.mkdir(parents=True, exist_ok=True)
        names = sorted(policy.spec.partitions)
        self._uids = {name: FIRST_HOST_UID + UID_RANGE * i for i, name in enumerate(names)}
        # sandboxes a killed server left would run beside the ones this server starts
        reap_leftovers(self.runtimes, gate.audit, names)

    def register_devices(self, registry: Registry) -> None:
        """Make every partition's sandbox a device of ``registry`` (this process only)."""
        register_sandbox_devices(registry, self.policy.spec.partitions, self.limits.memory_bytes)

    def plugin(self, stage: str, kind: str) -> SandboxedStage:
        """The plugin that runs ``stage`` inside its partition's sandbox. Raises (with what is
        missing) when the stage cannot be sandboxed here; never falls back."""
        partition_name = self.policy.spec.stages[stage].partition
        if partition_name is None:
            raise ValueError(f"stage {stage!r} has no partition")
        if kind not in SANDBOXED_KINDS:
            raise ValueError(
                f"stage {stage!r} ({kind}) cannot run sandboxed: only "
                f"{', '.join(SANDBOXED_KINDS)} stages take sensitive media"
            )
        partition = self.policy.spec.partitions[partition_name]
        runtime = choose_runtime(partition_name, partition, self.runtimes)
        keyring, key_name = open_key(partition.key, self.policy.spec.sandbox)
        store = PartitionStore(
            self.partitions_dir, partition_name, keyring, key_name, partition.cipher
        )
        sandboxed = SandboxedStage(self, stage, kind, runtime, store, self._uids[partition_name])
        sandboxed.worker.check_reach()
        return sandboxed


class SandboxedStage(StagePlugin):
    """A sensitive stage as the engine runs it: placed only on its partition's sandbox device,
    it loads nothing on the host; each input goes to the partition's sandbox worker."""

    name: ClassVar[str] = "sandboxed"

    def __init__(
        self,
        owner: SandboxedStages,
        stage: str,
        kind: str,
        runtime: SandboxRuntime,
        store: PartitionStore,
        host_uid: int,
    ) -> None:
        self.owner = owner
        self.stage = stage
        self.kind = kind
        self.store = store
        self.retain = owner.policy.spec.partitions[store.partition].retention_days is not None
        self.worker = SandboxedWorker(
            runtime,
            store.partition,
            store.directory,
            store.keyring,
            owner.state_dir / "workers" / stage,
            host_uid=host_uid,
            handler=f"stage:{kind}",
            limits=owner.limits,
            extra_mounts=(owner.model_cache,),
            extra_env=(f"HETERO_MODEL_CACHE={owner.model_cache}",),
        )
        self.device_ids = (sandbox_device(store.partition),)
        self._loaded = False
        self._lock = threading.Lock()
        self._store_lock = threading.Lock()

    @property
    def formats(self) -> tuple[GraphFormat, ...]:
        return ()  # nothing is loaded on a host device

    @property
    def loaded(self) -> bool:
        """Whether the sandbox is up."""
        return self._loaded

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {}

    def prepare(self) -> None:
        """Build the stage model's cached artefacts here, where the cache is writable."""
        from hetero.framework.registry import default_registry

        registry = default_registry()
        registry.load_plugins()
        model_class = registry.extensions("stage_model").get(self.kind)
        if model_class is None:
            raise RuntimeError(f"no {self.kind} model plugin is installed")
        model_class(cache_dir=self.owner.model_cache).prepare()

    def setup(self) -> None:
        """Start the partition's sandbox, which mounts the prepared files read-only and loads
        the model (after :meth:`prepare`)."""
        with self._lock:
            if self._loaded:
                return
            self.prepare()
            self.worker.start()
            self._loaded = True
        self.owner.gate.record(
            "sandbox_start",
            partition=self.store.partition,
            stage=self.stage,
            runtime=self.worker.runtime.name,
            sandbox=self.worker.sandbox_id,
        )

    def close(self) -> None:
        """Stop the sandbox."""
        if self._loaded:
            self.worker.stop()
            self._loaded = False
            self.owner.gate.record("sandbox_stop", partition=self.store.partition, stage=self.stage)

    def _store(self, data: bytes, subject: str | None) -> str:
        """Seal ``data`` into the partition with its data subject; the object id. A retained
        input stored again for the same subject is the same object (one sealed copy, not one
        per repeat); one that is not retained gets a fresh id and is deleted after use."""
        if not self.retain:
            object_id = f"{self.stage}-{uuid.uuid4().hex}"
        else:
            object_id = self.store.keyed_id(self.stage, data, subject)
            if self.store.exists(object_id):
                return object_id
        self.store.put(object_id, data, subject=subject)
        return object_id

    def _run(self, payload: bytes | SubjectData, variant: str) -> dict[str, Any]:
        data, subject = (
            (payload.data, payload.subject) if isinstance(payload, SubjectData) else (payload, None)
        )
        with self._store_lock:  # a repeat must not replace the object a call is reading
            object_id = self._store(data, subject)
            self.owner.gate.record(
                "key_use", partition=self.store.partition, object=object_id, op="seal+unwrap"
            )
            try:
                return self.worker.process(object_id, variant)
            finally:
                if not self.retain:
                    self.store.delete(object_id)

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """Each payload (image or audio bytes, or :class:`SubjectData`) runs inside the
        sandbox; results are what the stage's model gives (``{"text", "lines"}`` for OCR,
        ``{"text", "duration_s", "speech_s"}`` for speech)."""
        return each(lambda data: self._run(data, variant), payloads)
