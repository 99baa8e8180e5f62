"""The policy's server blocks: the HTTP server's settings and limits, API keys (their hashes,
never the keys) and tracing; part of the policy schema (:mod:`.schema`), documented in
``docs/policy.md`` and ``docs/serving.md``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import (
    AfterValidator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)
from pyrsistent import pmap

from hetero.framework.policy.fields import (
    Frozen,
    Name,
    PositiveBytes,
    PositiveFloat,
    PositiveInt,
    freeze,
)

ScryptHash = Annotated[
    StrictStr, Field(pattern=r"^scrypt\$[0-9]+\$[0-9]+\$[0-9]+\$[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+$")
]
"""``scrypt$<log2 N>$<r>$<p>$<salt, base64>$<digest, base64>``."""


class ApiKeyConfig(Frozen):
    """One API key, never the key itself: ``hash`` is a salted scrypt hash (``hetero keys
    hash``); ``sha256``, the unsalted hex digest older policies hold, is still accepted."""

    name: Name
    hash: ScryptHash | None = None
    sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    roles: tuple[Name, ...] = ()
    attributes: Annotated[Mapping[StrictStr, StrictStr], AfterValidator(freeze)] = pmap()
    max_qos_class: Name | None = None
    sla_tier: Name | None = None

    @model_validator(mode="after")
    def _one_hash(self) -> ApiKeyConfig:
        if (self.hash is None) == (self.sha256 is None):
            raise ValueError("give exactly one of hash (scrypt: hetero keys hash) or sha256")
        return self


class ServerLimits(Frozen):
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


class ServerConfig(Frozen):
    """``hetero serve``: where it listens, who may call it, what a request may carry, and how
    each stage is run (a pinned runtime, worker threads, the queue depth that degrades)."""

    host: Name = "127.0.0.1"
    port: Annotated[StrictInt, Field(ge=0, le=65535)] = 8000
    api_keys: tuple[ApiKeyConfig, ...] = ()
    api_keys_file: Name | None = None
    limits: ServerLimits = ServerLimits()
    runtimes: Annotated[Mapping[StrictStr, Name], AfterValidator(freeze)] = pmap()
    model_threads: Annotated[Mapping[StrictStr, PositiveInt], AfterValidator(freeze)] = pmap()
    nice: Annotated[
        Mapping[StrictStr, Annotated[StrictInt, Field(ge=0, le=19)]], AfterValidator(freeze)
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


class TracingConfig(Frozen):
    """``tracing:``: OpenTelemetry spans per request and per stage, exported over OTLP/HTTP
    (needs the ``hetero[otel]`` extra; off by default, and then nothing of it is imported)."""

    enabled: StrictBool = False
    endpoint: StrictStr = "http://127.0.0.1:4318/v1/traces"  # an OTLP/HTTP traces URL
    sampling: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0  # share of new traces kept
    service_name: Name = "hetero"
