"""The policy file's schema: frozen pydantic models, mappings frozen as pyrsistent maps.

Every key is documented in ``docs/policy.md``; keep the two together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)
from pyrsistent import pmap

from hetero.framework.policy.quantities import parse_quantity

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

DeviceClassName = Literal["cuda", "rocm", "npu", "cpu"]

CIPHERS = ("AES-256-GCM", "SM4-GCM")
DEVICE_CLASSES: tuple[DeviceClassName, ...] = ("cuda", "rocm", "npu", "cpu")
PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
OpenFraction = Annotated[float, Field(gt=0.0, lt=1.0)]
PositiveFloat = Annotated[float, Field(gt=0.0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0)]
Name = Annotated[StrictStr, Field(min_length=1)]


def _bytes(value: object) -> object:
    parsed = parse_quantity(value, "B")
    if isinstance(parsed, float) and parsed.is_integer():
        return int(parsed)
    return parsed


def _rate(unit: str) -> BeforeValidator:
    return BeforeValidator(lambda value: parse_quantity(value, unit))


Bytes = Annotated[StrictInt, BeforeValidator(_bytes), Field(ge=0)]
PositiveBytes = Annotated[StrictInt, BeforeValidator(_bytes), Field(gt=0)]
Bandwidth = Annotated[float, _rate("B/s"), Field(gt=0.0)]
Flops = Annotated[float, _rate("FLOPS"), Field(gt=0.0)]
FlopCount = Annotated[float, _rate("FLOPS"), Field(ge=0.0)]
ByteCount = Annotated[float, _rate("B"), Field(ge=0.0)]


def _freeze(value: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return pmap(value)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


# --- devices -----------------------------------------------------------------------------------


class LinkConfig(_Frozen):
    """A link from the overridden or simulated device to ``peer``."""

    peer: Name
    kind: Literal["nvlink", "xgmi", "pcie", "network"]
    bandwidth: Bandwidth
    latency_us: NonNegativeFloat = 0.0


class DeviceOverride(_Frozen):
    """Figures that replace what discovery reported for one device."""

    memory: PositiveBytes | None = None
    memory_bandwidth: Bandwidth | None = None
    peak_flops: Annotated[Mapping[StrictStr, Flops], AfterValidator(_freeze)] | None = None
    links: tuple[LinkConfig, ...] | None = None
    numa_node: NonNegativeInt | None = None
    site: Name | None = None
    zone: Name | None = None


class SimulatedDeviceGroup(_Frozen):
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
    peak_flops: Annotated[Mapping[StrictStr, Flops], AfterValidator(_freeze)] | None = None
    interconnect: Literal["nvlink", "xgmi", "pcie", "network", "none"] | None = None
    interconnect_bandwidth: Bandwidth | None = None
    host_bandwidth: Bandwidth | None = None


class NetworkConfig(_Frozen):
    """The network between hosts."""

    bandwidth: Bandwidth = 25e9
    latency_us: NonNegativeFloat = 5.0


class DevicesConfig(_Frozen):
    """Which devices the policy may use, and corrections to their specs."""

    allow: tuple[Name, ...] = ("*",)
    deny: tuple[Name, ...] = ()
    overrides: Annotated[Mapping[StrictStr, DeviceOverride], AfterValidator(_freeze)] = pmap()
    simulated: tuple[SimulatedDeviceGroup, ...] = ()
    network: NetworkConfig = NetworkConfig()


# --- stages and pipelines ----------------------------------------------------------------------


class GraphSource(_Frozen):
    """Where a variant's model comes from; resolved by the backend or a stage plugin at load."""

    format: Literal["onnx", "openvino_ir", "torch", "vllm"]
    source: Name


class VariantConfig(_Frozen):
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


class LocalityConfig(_Frozen):
    """Where a stage may run (data locality): every key given must match the device's;
    ``require`` rules other devices out, ``prefer`` tries matching devices first."""

    site: Name | None = None
    zone: Name | None = None
    host: Name | None = None
    numa_node: NonNegativeInt | None = None
    mode: Literal["require", "prefer"] = "require"


class RolloutConfig(_Frozen):
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


class StageConfig(_Frozen):
    """A model step: modality, variants, where it may run, which partition it touches."""

    modality: Literal["text", "image", "audio", "video", "embedding"]
    variants: Annotated[Mapping[Literal["full", "light"], VariantConfig], AfterValidator(_freeze)]
    device_classes: tuple[DeviceClassName, ...] = DEVICE_CLASSES
    partition: Name | None = None
    model_version: StrictStr = "1"
    min_residency_s: NonNegativeFloat | None = None
    locality: LocalityConfig | None = None
    rollout: RolloutConfig = RolloutConfig()


class StepConfig(_Frozen):
    """A stage in a pipeline; ``after`` omitted means "after the previous step"."""

    stage: Name
    name: Name | None = None
    after: tuple[Name, ...] | None = None


class PipelineConfig(_Frozen):
    """A DAG of steps."""

    steps: tuple[StepConfig, ...] = Field(min_length=1)


# --- QoS, scheduler, breakers ------------------------------------------------------------------


class SlaTier(_Frozen):
    """A latency promise: requests of classes on this tier have this deadline."""

    deadline_ms: PositiveFloat
    target_attainment: Fraction = 0.99


class QosClass(_Frozen):
    """A priority class: higher weight is served sooner; aging keeps low classes moving."""

    weight: PositiveFloat
    sla_tier: Name
    queue_bound: PositiveInt = 1024
    max_load_wait_s: PositiveFloat | None = None
    """How long a task of this class may wait for its model to become resident before minimum
    residency stops protecting other models (None: ``scheduler.max_load_wait_s``)."""


class QosConfig(_Frozen):
    """QoS classes, the default class, and how fast waiting raises priority."""

    default_class: Name
    aging_per_second: NonNegativeFloat = 1.0
    classes: Annotated[Mapping[StrictStr, QosClass], AfterValidator(_freeze)]


class BatchingConfig(_Frozen):
    """Defaults for per-(stage, device) batching; a variant's own figures win. ``llm`` is how
    a stage with a KV cache (``kv_bytes_per_token``) batches in simulation: ``continuous``
    (iteration-level, as vLLM-style engines run it: requests join at the next decode step and
    leave when done) or ``static`` (a batch runs until its longest output is done)."""

    max_delay_ms: NonNegativeFloat = 5.0
    llm: Literal["continuous", "static"] = "continuous"
    dispatch_ahead_ms: PositiveFloat | None = None


class PlacementWeights(_Frozen):
    """Multipliers on the cost terms of the placement estimate."""

    queue: NonNegativeFloat = 1.0
    load: NonNegativeFloat = 1.0
    compute: NonNegativeFloat = 1.0
    transfer: NonNegativeFloat = 1.0


class WarmupConfig(_Frozen):
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


class SchedulerConfig(_Frozen):
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


class ComplexityWeights(_Frozen):
    """Weights of a request's profile terms, each in a fixed unit (see docs/policy.md)."""

    text_tokens: NonNegativeFloat = 1.0  # per 1,000 tokens
    image_pixels: NonNegativeFloat = 1.0  # per megapixel
    audio_seconds: NonNegativeFloat = 1.0  # per 30 seconds


class ComplexityBreaker(_Frozen):
    """Admit, degrade to ``light`` or shed, by a request's estimated cost on the stage's devices
    against its QoS class's deadline (framework/scheduler/breakers.py)."""

    degrade_at: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    weights: ComplexityWeights = ComplexityWeights()


class DeviceBreaker(_Frozen):
    """Per-(stage, device) breaker on errors and slow calls (resilience4j's semantics)."""

    window: PositiveInt = 20
    min_calls: PositiveInt = 5
    error_rate: Fraction = 0.5
    slow_call_rate: Fraction = 0.8
    slow_call_s: PositiveFloat = 10.0
    open_s: PositiveFloat = 10.0
    half_open_probes: PositiveInt = 1


class CircuitBreakerConfig(_Frozen):
    """Both breaker layers."""

    complexity: ComplexityBreaker = ComplexityBreaker()
    device: DeviceBreaker = DeviceBreaker()


# --- cache -------------------------------------------------------------------------------------


class MemoryTier(_Frozen):
    """L1: in-process."""

    enabled: StrictBool = True
    max_bytes: PositiveBytes = 256 * 2**20


class DiskTier(_Frozen):
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


class RedisTier(_Frozen):
    """L2: Redis, shared by workers and hosts."""

    enabled: StrictBool = False
    url: Annotated[Name, AfterValidator(_redis_url)] = "redis://127.0.0.1:6379/0"
    timeout_ms: PositiveFloat = 50.0


class BloomConfig(_Frozen):
    """The Bloom filter in front of the tiers."""

    expected_entries: PositiveInt = 1_000_000
    false_positive_rate: OpenFraction = 0.01


class CacheConfig(_Frozen):
    """The feature cache."""

    enabled: StrictBool = True
    memory: MemoryTier = MemoryTier()
    disk: DiskTier = DiskTier()
    redis: RedisTier = RedisTier()
    bloom: BloomConfig = BloomConfig()
    ttl_s: PositiveFloat = 86_400.0
    ttl_jitter: Fraction = 0.1
    sensitive: Literal["encrypt", "skip"] = "encrypt"


# --- partitions --------------------------------------------------------------------------------


CLASSIFICATIONS = ("public", "internal", "confidential", "secret")
Classification = Literal["public", "internal", "confidential", "secret"]
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
ClockTime = Annotated[StrictStr, Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]


class AttributeRule(_Frozen):
    """The caller's attribute must take one of these values (``one_of``), or be a clearance
    level at least this high (``at_least``, ordered public < internal < confidential < secret).
    """

    attribute: Name
    one_of: tuple[StrictStr, ...] | None = Field(default=None, min_length=1)
    at_least: Classification | None = None

    @model_validator(mode="after")
    def _one_test(self) -> AttributeRule:
        if (self.one_of is None) == (self.at_least is None):
            raise ValueError("give exactly one of one_of or at_least")
        return self


class AccessHours(_Frozen):
    """When a partition may be accessed: days of the week and a daily window, in the site's
    time zone given as an offset from UTC (China Standard Time is +8)."""

    days: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
    start: ClockTime = "00:00"
    end: ClockTime = "23:59"
    utc_offset_hours: Annotated[float, Field(ge=-12.0, le=14.0)] = 8.0


AttestationKind = Literal["sev-snp", "tdx", "sgx", "csv", "nvidia"]
# a measurement or signer in hex: up to TDX's MRTD and RTMR0-3 (5 x 48 bytes)
HexDigest = Annotated[StrictStr, Field(pattern=r"^[0-9a-fA-F]{32,480}$")]


class AttestationPolicy(_Frozen):
    """What a partition's sandbox must prove with hardware evidence before it gets the
    partition's keys (checked by ``hetero.sandbox.attestation``): the evidence kinds accepted,
    the measurements or signers allowed (one of the two lists at least), the minimum TCB parts
    (``bl``, ``tee``, ``snp``, ``ucode``, ``fmc`` for SEV-SNP; ``pcesvn`` for SGX and TDX), the
    TCB statuses accepted (Intel's names; ``OK`` for vendors without one), and whether a
    debuggable guest is accepted (never by default)."""

    kinds: tuple[AttestationKind, ...] = Field(min_length=1)
    measurements: tuple[HexDigest, ...] = ()
    signers: tuple[HexDigest, ...] = ()
    min_tcb: Annotated[Mapping[Name, NonNegativeInt], AfterValidator(_freeze)] = pmap()
    tcb_statuses: tuple[Name, ...] = ("UpToDate", "OK")
    allow_debug: StrictBool = False
    product: Literal["milan", "genoa", "turin"] | None = None

    @model_validator(mode="after")
    def _something_allowed(self) -> AttestationPolicy:
        if not self.measurements and not self.signers:
            raise ValueError("attestation needs allowed measurements or signers (or both)")
        if set(self.kinds) == {"nvidia"}:  # its report data cannot carry the key's binding
            raise ValueError(
                "nvidia evidence proves a GPU, not the sandbox that would get the key: list "
                "the CPU TEE kind too (sev-snp, tdx, sgx or csv)"
            )
        return self


class PartitionConfig(_Frozen):
    """A data partition: what it holds, how it is encrypted and isolated, who may touch it."""

    modality: Literal["text", "image", "audio", "video", "embedding"]
    classification: Classification
    cipher: Literal["AES-256-GCM", "SM4-GCM"]
    key: Annotated[StrictStr, Field(pattern=r"^(file|pkcs11):.+")]
    isolation: Literal["tee", "vm", "container", "process"]
    retention_days: PositiveInt | None = None
    roles: tuple[Name, ...] = Field(min_length=1)
    attribute_rules: tuple[AttributeRule, ...] = ()
    access_hours: AccessHours | None = None
    purposes: tuple[Name, ...] = ()
    attestation: AttestationPolicy | None = None


MaskedField = Literal["id_number", "mobile", "bank_card", "email"]


class MaskingConfig(_Frozen):
    """Field-level masking of outputs: each kind of field is masked unless the caller holds one
    of the roles listed for it."""

    enabled: StrictBool = True
    clear_for: Annotated[Mapping[MaskedField, tuple[Name, ...]], AfterValidator(_freeze)] = pmap()


class AuditConfig(_Frozen):
    """The signed, hash-chained audit log."""

    path: Name = "~/.local/state/hetero/audit.log"
    hash: Literal["sha256", "sm3"] = "sha256"
    signing_key: Name = "~/.config/hetero/audit-signing.pem"
    checkpoint_every: PositiveInt = 100
    checkpoint_interval_s: PositiveFloat = 5.0
    max_checkpoint_age_s: PositiveFloat = 60.0
    anchor: Name | None = None


RuntimeName = Literal["kata", "gvisor", "containerd", "runc", "bwrap"]


class SandboxConfig(_Frozen):
    """Where sandboxes run and where partitions and keys are kept."""

    runtimes: tuple[RuntimeName, ...] = ("kata", "gvisor", "containerd", "runc", "bwrap")
    containerd_address: Name = "/run/containerd/containerd.sock"
    state_dir: Name = "~/.local/state/hetero/sandbox"
    partitions_dir: Name = "~/.local/state/hetero/partitions"
    keyring: Name = "~/.config/hetero/keyring.json"
    pkcs11_library: Name = "/usr/lib/softhsm/libsofthsm2.so"
    pkcs11_pin_env: Name = "HETERO_PKCS11_PIN"
    worker_memory: PositiveBytes = 2 * 2**30
    worker_pids: PositiveInt = 256
    worker_cpus: PositiveFloat = 1.0


# --- server ----------------------------------------------------------------------------------


ScryptHash = Annotated[
    StrictStr, Field(pattern=r"^scrypt\$[0-9]+\$[0-9]+\$[0-9]+\$[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+$")
]
"""``scrypt$<log2 N>$<r>$<p>$<salt, base64>$<digest, base64>``."""


class ApiKeyConfig(_Frozen):
    """One API key, never the key itself: ``hash`` is a salted scrypt hash (``hetero keys
    hash``); ``sha256``, the unsalted hex digest older policies hold, is still accepted."""

    name: Name
    hash: ScryptHash | None = None
    sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    roles: tuple[Name, ...] = ()
    attributes: Annotated[Mapping[StrictStr, StrictStr], AfterValidator(_freeze)] = pmap()
    max_qos_class: Name | None = None
    sla_tier: Name | None = None

    @model_validator(mode="after")
    def _one_hash(self) -> ApiKeyConfig:
        if (self.hash is None) == (self.sha256 is None):
            raise ValueError("give exactly one of hash (scrypt: hetero keys hash) or sha256")
        return self


class ServerLimits(_Frozen):
    """What one request may carry; larger requests are refused with 413 or 400."""

    max_body_bytes: PositiveBytes = 20 * 2**20
    max_image_pixels: PositiveInt = 40_000_000
    max_audio_seconds: PositiveFloat = 120.0
    max_input_tokens: PositiveInt = 2048
    max_output_tokens: PositiveInt = 512
    max_batch_inputs: PositiveInt = 256
    header_timeout_s: PositiveFloat = 10.0  # a connection's request line and headers
    max_header_bytes: PositiveBytes = 16 * 2**10  # a request's line and headers (h11's bound)
    body_timeout_s: PositiveFloat = 30.0  # a request's whole body, from its first byte


class ServerConfig(_Frozen):
    """``hetero serve``: where it listens, who may call it, what a request may carry, and how
    each stage is run (a pinned runtime, worker threads, the queue depth that degrades)."""

    host: Name = "127.0.0.1"
    port: Annotated[StrictInt, Field(ge=0, le=65535)] = 8000
    api_keys: tuple[ApiKeyConfig, ...] = ()
    api_keys_file: Name | None = None
    limits: ServerLimits = ServerLimits()
    runtimes: Annotated[Mapping[StrictStr, Name], AfterValidator(_freeze)] = pmap()
    model_threads: Annotated[Mapping[StrictStr, PositiveInt], AfterValidator(_freeze)] = pmap()
    nice: Annotated[
        Mapping[StrictStr, Annotated[StrictInt, Field(ge=0, le=19)]], AfterValidator(_freeze)
    ] = pmap()
    threads_per_model: PositiveInt = 1
    peer_routes: StrictBool = False
    allowed_hosts: tuple[Name, ...] = ()  # Host header names; () on loopback: loopback names
    allowed_origins: tuple[Name, ...] = ()  # browser origins allowed to POST (e.g. a web UI)
    # addresses (or CIDR networks) whose X-Forwarded-For / -Proto headers are believed; () none:
    # the peer address is the client's, whatever a header says (throttling and fair shares)
    trusted_proxies: tuple[Name, ...] = ()
    # the request header that names a request's data subject (erasure by subject reaches what a
    # partition stored of it); the OpenAI `user` field names it when the header is absent
    subject_header: Name = "X-Data-Subject"
    queue_bound: PositiveInt = 64
    degrade_queue_depth: PositiveInt = 16
    retry_after_s: PositiveFloat = 1.0


class TracingConfig(_Frozen):
    """``tracing:``: OpenTelemetry spans per request and per stage, exported over OTLP/HTTP
    (needs the ``hetero[otel]`` extra; off by default, and then nothing of it is imported)."""

    enabled: StrictBool = False
    endpoint: StrictStr = "http://127.0.0.1:4318/v1/traces"  # an OTLP/HTTP traces URL
    sampling: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0  # share of new traces kept
    service_name: Name = "hetero"


# --- the whole file ----------------------------------------------------------------------------


class ClusterConfig(_Frozen):
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
        Mapping[StrictStr, Annotated[int, Field(ge=2)]], AfterValidator(_freeze)
    ] = pmap()


class PolicySpec(_Frozen):
    """One policy file."""

    version: Literal[1]
    name: Name = "unnamed"
    description: StrictStr = ""
    devices: DevicesConfig = DevicesConfig()
    stages: Annotated[Mapping[StrictStr, StageConfig], AfterValidator(_freeze)]
    pipelines: Annotated[Mapping[StrictStr, PipelineConfig], AfterValidator(_freeze)] = pmap()
    routes: Annotated[Mapping[StrictStr, Name], AfterValidator(_freeze)] = pmap()
    qos: QosConfig
    sla_tiers: Annotated[Mapping[StrictStr, SlaTier], AfterValidator(_freeze)]
    scheduler: SchedulerConfig = SchedulerConfig()
    circuit_breaker: CircuitBreakerConfig = CircuitBreakerConfig()
    cache: CacheConfig = CacheConfig()
    partitions: Annotated[Mapping[StrictStr, PartitionConfig], AfterValidator(_freeze)] = pmap()
    masking: MaskingConfig = MaskingConfig()
    audit: AuditConfig = AuditConfig()
    sandbox: SandboxConfig = SandboxConfig()
    server: ServerConfig = ServerConfig()
    tracing: TracingConfig = TracingConfig()
    cluster: ClusterConfig = ClusterConfig()
