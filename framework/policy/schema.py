"""The policy file's schema: frozen pydantic models, mappings frozen as pyrsistent maps.

Every key is documented in ``docs/policy.md``; keep the two together. The compliance blocks
are in :mod:`.compliance_schema`, the server's in :mod:`.server_schema`, the field types and
the frozen base in :mod:`.fields`; every model is imported from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    Field,
    StrictBool,
    StrictStr,
)
from pyrsistent import pmap

from hetero.framework.policy.compliance_schema import (
    CLASSIFICATIONS,
    AccessHours,
    AttestationPolicy,
    AttributeRule,
    AuditConfig,
    MaskingConfig,
    PartitionConfig,
    SandboxConfig,
)
from hetero.framework.policy.fields import (
    CIPHERS,
    DEVICE_CLASSES,
    Bandwidth,
    ByteCount,
    Bytes,
    DeviceClassName,
    FlopCount,
    Flops,
    Fraction,
    Frozen,
    Name,
    NonNegativeFloat,
    NonNegativeInt,
    OpenFraction,
    PositiveBytes,
    PositiveFloat,
    PositiveInt,
    freeze,
)
from hetero.framework.policy.server_schema import (
    ApiKeyConfig,
    ServerConfig,
    ServerLimits,
    TracingConfig,
)

__all__ = [
    "CIPHERS",
    "CLASSIFICATIONS",
    "DEVICE_CLASSES",
    "AccessHours",
    "ApiKeyConfig",
    "AttestationPolicy",
    "AttributeRule",
    "AuditConfig",
    "BatchingConfig",
    "CacheConfig",
    "CircuitBreakerConfig",
    "ClusterConfig",
    "DevicesConfig",
    "MaskingConfig",
    "PartitionConfig",
    "PipelineConfig",
    "PolicySpec",
    "QosConfig",
    "RolloutConfig",
    "SandboxConfig",
    "SchedulerConfig",
    "ServerConfig",
    "ServerLimits",
    "StageConfig",
    "TracingConfig",
    "VariantConfig",
]


# --- devices -----------------------------------------------------------------------------------


class LinkConfig(Frozen):
    """A link from the overridden or simulated device to ``peer``."""

    peer: Name
    kind: Literal["nvlink", "xgmi", "pcie", "network"]
    bandwidth: Bandwidth
    latency_us: NonNegativeFloat = 0.0


class DeviceOverride(Frozen):
    """Figures that replace what discovery reported for one device."""

    memory: PositiveBytes | None = None
    memory_bandwidth: Bandwidth | None = None
    peak_flops: Annotated[Mapping[StrictStr, Flops], AfterValidator(freeze)] | None = None
    links: tuple[LinkConfig, ...] | None = None
    numa_node: NonNegativeInt | None = None
    site: Name | None = None
    zone: Name | None = None


class SimulatedDeviceGroup(Frozen):
    """``count`` identical simulated devices per host, on ``hosts`` hosts, for planning and the
    simulator (``hosts: 125`` with ``count: 8`` is a 1,000-device fleet in one group).

    Figures come from ``preset`` (see ``hetero.framework.device_presets``) and any key given
    here overrides the preset's; without a preset, class, vendor_name, memory,
    memory_bandwidth and peak_flops are required.
    """

    name: Name
    preset: Name | None = None
    device_class: DeviceClassName | None = Field(default=None, alias="class")
    vendor_name: Name | None = None
    count: PositiveInt = 1
    host: Name = "sim-host-0"
    site: Name | None = None
    zone: Name | None = None
    hosts: PositiveInt = 1
    memory: PositiveBytes | None = None
    memory_bandwidth: Bandwidth | None = None
    peak_flops: Annotated[Mapping[StrictStr, Flops], AfterValidator(freeze)] | None = None
    interconnect: Literal["nvlink", "xgmi", "pcie", "network", "none"] | None = None
    interconnect_bandwidth: Bandwidth | None = None
    host_bandwidth: Bandwidth | None = None


class NetworkConfig(Frozen):
    """The network between hosts."""

    bandwidth: Bandwidth = 25e9
    latency_us: NonNegativeFloat = 5.0


class DevicesConfig(Frozen):
    """Which devices the policy may use, and corrections to their specs."""

    allow: tuple[Name, ...] = ("*",)
    deny: tuple[Name, ...] = ()
    overrides: Annotated[Mapping[StrictStr, DeviceOverride], AfterValidator(freeze)] = pmap()
    simulated: tuple[SimulatedDeviceGroup, ...] = ()
    network: NetworkConfig = NetworkConfig()


# --- stages and pipelines ----------------------------------------------------------------------


class GraphSource(Frozen):
    """Where a variant's model comes from; resolved by the backend or a stage plugin at load."""

    format: Literal["onnx", "openvino_ir", "torch", "vllm"]
    source: Name


class VariantConfig(Frozen):
    """One graph variant of a stage: batching, and its BandwidthHint figures where no stage
    plugin gives them (a stage a plugin serves is costed by the plugin's graphs, the one
    source; figures here are for simulated and planned fleets)."""

    graph: GraphSource | None = None
    flops_per_item: FlopCount | None = None
    bytes_per_item: ByteCount | None = None
    input_bytes: Bytes = 0
    output_bytes: Bytes = 0
    resident_bytes: Bytes = 0
    batchable: StrictBool = True
    max_batch: PositiveInt = 1
    dtype: Literal["fp32", "fp16", "bf16", "int8"] = "fp32"
    kv_bytes_per_token: ByteCount = 0.0
    max_delay_ms: NonNegativeFloat | None = None
    dispatch_ahead_ms: PositiveFloat | None = None


class LocalityConfig(Frozen):
    """Where a stage may run (data locality): every key given must match the device's;
    ``require`` rules other devices out, ``prefer`` tries matching devices first."""

    site: Name | None = None
    zone: Name | None = None
    host: Name | None = None
    numa_node: NonNegativeInt | None = None
    mode: Literal["require", "prefer"] = "require"


class RolloutConfig(Frozen):
    """How a changed ``model_version`` takes over from the old one on a policy reload.

    The new version is loaded beside the old and probed with its plugin's warm-up inputs;
    then ``all_at_once`` sends every new request to it, while ``canary`` sends it
    ``canary_share`` of them (counted: every 1/share-th request) until both ``canary_s``
    have passed and ``canary_min_requests`` were answered by it. A canary whose failures
    exceed ``max_error_rate`` of ``max(its requests, canary_min_requests)`` is rolled back.
    """

    strategy: Literal["all_at_once", "canary"] = "all_at_once"
    canary_share: Annotated[float, Field(gt=0.0, le=1.0)] = 0.1
    canary_s: NonNegativeFloat = 30.0
    canary_min_requests: PositiveInt = 20
    max_error_rate: Fraction = 0.05


class StageConfig(Frozen):
    """A model step: modality, variants, where it may run, which partition it touches."""

    modality: Literal["text", "image", "audio", "video", "embedding"]
    variants: Annotated[Mapping[Literal["full", "light"], VariantConfig], AfterValidator(freeze)]
    device_classes: tuple[DeviceClassName, ...] = DEVICE_CLASSES
    partition: Name | None = None
    model_version: StrictStr = "1"
    min_residency_s: NonNegativeFloat | None = None
    locality: LocalityConfig | None = None
    rollout: RolloutConfig = RolloutConfig()


class StepConfig(Frozen):
    """A stage in a pipeline; ``after`` omitted means "after the previous step"."""

    stage: Name
    name: Name | None = None
    after: tuple[Name, ...] | None = None


class PipelineConfig(Frozen):
    """A DAG of steps."""

    steps: tuple[StepConfig, ...] = Field(min_length=1)


# --- QoS, scheduler, breakers ------------------------------------------------------------------


class SlaTier(Frozen):
    """A latency promise: requests of classes on this tier have this deadline."""

    deadline_ms: PositiveFloat
    target_attainment: Fraction = 0.99


class QosClass(Frozen):
    """A priority class: higher weight is served sooner; aging keeps low classes moving."""

    weight: PositiveFloat
    sla_tier: Name
    queue_bound: PositiveInt = 1024
    max_load_wait_s: PositiveFloat | None = None
    """How long a task of this class may wait for its model to become resident before minimum
    residency stops protecting other models (None: ``scheduler.max_load_wait_s``)."""


class QosConfig(Frozen):
    """QoS classes, the default class, and how fast waiting raises priority."""

    default_class: Name
    aging_per_second: NonNegativeFloat = 1.0
    classes: Annotated[Mapping[StrictStr, QosClass], AfterValidator(freeze)]


class BatchingConfig(Frozen):
    """Defaults for per-(stage, device) batching; a variant's own figures win. ``llm`` is how
    a stage with a KV cache (``kv_bytes_per_token``) batches in simulation: ``continuous``
    (iteration-level, as vLLM-style engines run it: requests join at the next decode step and
    leave when done) or ``static`` (a batch runs until its longest output is done)."""

    max_delay_ms: NonNegativeFloat = 5.0
    llm: Literal["continuous", "static"] = "continuous"
    dispatch_ahead_ms: PositiveFloat | None = None


class PlacementWeights(Frozen):
    """Multipliers on the cost terms of the placement estimate."""

    queue: NonNegativeFloat = 1.0
    load: NonNegativeFloat = 1.0
    compute: NonNegativeFloat = 1.0
    transfer: NonNegativeFloat = 1.0


class WarmupConfig(Frozen):
    """Predictive warm-up: forecast each model's arrival rate (Holt-Winters exponential
    smoothing over ``bin_s`` bins, a season of ``season_s``; 0 for none) and load it ahead of
    its traffic, release it after."""

    enabled: StrictBool = False
    bin_s: PositiveFloat = 30.0
    alpha: OpenFraction = 0.5
    beta: Fraction = 0.3
    gamma: Fraction = 0.5
    season_s: NonNegativeFloat = 86400.0
    lead_s: NonNegativeFloat = 60.0
    load_rate_per_s: PositiveFloat = 0.05
    release_rate_per_s: NonNegativeFloat = 0.0


class SchedulerConfig(Frozen):
    """Placement policy and memory-manager settings."""

    placement: Literal["cost_model", "round_robin", "least_connections"] = "cost_model"
    weights: PlacementWeights = PlacementWeights()
    memory_reserve_fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    min_residency_s: NonNegativeFloat = 30.0
    max_load_wait_s: PositiveFloat = 10.0
    kv_block_tokens: PositiveInt = 16
    warmup: WarmupConfig = WarmupConfig()
    measured_smoothing: OpenFraction = 0.2
    batching: BatchingConfig = BatchingConfig()


class ComplexityWeights(Frozen):
    """Weights of a request's profile terms, each in a fixed unit (see docs/policy.md)."""

    text_tokens: NonNegativeFloat = 1.0  # per 1,000 tokens
    image_pixels: NonNegativeFloat = 1.0  # per megapixel
    audio_seconds: NonNegativeFloat = 1.0  # per 30 seconds


class ComplexityBreaker(Frozen):
    """Admit, degrade to ``light`` or shed, by a request's estimated cost on the stage's devices
    against its QoS class's deadline (framework/scheduler/breakers.py)."""

    degrade_at: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    weights: ComplexityWeights = ComplexityWeights()


class DeviceBreaker(Frozen):
    """Per-(stage, device) breaker on errors and slow calls (resilience4j's semantics)."""

    window: PositiveInt = 20
    min_calls: PositiveInt = 5
    error_rate: Fraction = 0.5
    slow_call_rate: Fraction = 0.8
    slow_call_s: PositiveFloat = 10.0
    open_s: PositiveFloat = 10.0
    half_open_probes: PositiveInt = 1


class CircuitBreakerConfig(Frozen):
    """Both breaker layers."""

    complexity: ComplexityBreaker = ComplexityBreaker()
    device: DeviceBreaker = DeviceBreaker()


# --- cache -------------------------------------------------------------------------------------


class MemoryTier(Frozen):
    """L1: in-process."""

    enabled: StrictBool = True
    max_bytes: PositiveBytes = 256 * 2**20


class DiskTier(Frozen):
    """L3: local disk, survives restarts."""

    enabled: StrictBool = True
    path: Name = "~/.cache/hetero/features"
    max_bytes: PositiveBytes = 2 * 2**30


def _redis_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in {"redis", "rediss", "unix"}:
        raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got {value!r}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"expected a host in the Redis URL, got {value!r}")
    try:
        parts.port  # noqa: B018 - parsing the port validates it
    except ValueError as err:
        raise ValueError(f"bad port in the Redis URL {value!r}: {err}") from None
    return value


class RedisTier(Frozen):
    """L2: Redis, shared by workers and hosts."""

    enabled: StrictBool = False
    url: Annotated[Name, AfterValidator(_redis_url)] = "redis://127.0.0.1:6379/0"
    timeout_ms: PositiveFloat = 50.0


class BloomConfig(Frozen):
    """The Bloom filter in front of the tiers."""

    expected_entries: PositiveInt = 1_000_000
    false_positive_rate: OpenFraction = 0.01


class CacheConfig(Frozen):
    """The feature cache."""

    enabled: StrictBool = True
    memory: MemoryTier = MemoryTier()
    disk: DiskTier = DiskTier()
    redis: RedisTier = RedisTier()
    bloom: BloomConfig = BloomConfig()
    ttl_s: PositiveFloat = 86_400.0
    ttl_jitter: Fraction = 0.1
    sensitive: Literal["encrypt", "skip"] = "encrypt"


# --- the whole file ----------------------------------------------------------------------------


class ClusterConfig(Frozen):
    """Where the engine runs its devices: this process (``embedded``), or a Ray cluster
    (``ray``, the ``hetero[ray]`` extra) whose every node's devices join one fleet."""

    engine: Literal["embedded", "ray"] = "embedded"
    address: StrictStr = "auto"  # ray.init's: "auto" (a running cluster) or "ray://host:port"
    namespace: Name = "hetero"
    heartbeat_s: PositiveFloat = 2.0  # how often the engine asks the cluster who joined or left
    # how long a call to a device's actor may take before the device's breaker counts it failed
    # (a run, a read of kept outputs; a streamed run: the wait for its next piece), and a load
    call_timeout_s: PositiveFloat = 60.0
    load_timeout_s: PositiveFloat = 600.0
    # models that span devices: a node's devices named this key plus an index ("vllm:cuda"),
    # this many to one fleet device in a placement group (framework/cluster/device_groups.py)
    device_groups: Annotated[
        Mapping[StrictStr, Annotated[int, Field(ge=2)]], AfterValidator(freeze)
    ] = pmap()


class PolicySpec(Frozen):
    """One policy file."""

    version: Literal[1]
    name: Name = "unnamed"
    description: StrictStr = ""
    devices: DevicesConfig = DevicesConfig()
    stages: Annotated[Mapping[StrictStr, StageConfig], AfterValidator(freeze)]
    pipelines: Annotated[Mapping[StrictStr, PipelineConfig], AfterValidator(freeze)] = pmap()
    routes: Annotated[Mapping[StrictStr, Name], AfterValidator(freeze)] = pmap()
    qos: QosConfig
    sla_tiers: Annotated[Mapping[StrictStr, SlaTier], AfterValidator(freeze)]
    scheduler: SchedulerConfig = SchedulerConfig()
    circuit_breaker: CircuitBreakerConfig = CircuitBreakerConfig()
    cache: CacheConfig = CacheConfig()
    partitions: Annotated[Mapping[StrictStr, PartitionConfig], AfterValidator(freeze)] = pmap()
    masking: MaskingConfig = MaskingConfig()
    audit: AuditConfig = AuditConfig()
    sandbox: SandboxConfig = SandboxConfig()
    server: ServerConfig = ServerConfig()
    tracing: TracingConfig = TracingConfig()
    cluster: ClusterConfig = ClusterConfig()
