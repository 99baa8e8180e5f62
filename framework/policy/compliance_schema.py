"""The policy's compliance blocks: data partitions (who may touch them, when, from which
attested platform), field masking, the audit log and the sandboxes; part of the policy schema
(:mod:`.schema`), documented in ``docs/policy.md`` and ``docs/compliance.md``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    StrictBool,
    StrictStr,
    model_validator,
)
from pyrsistent import pmap

from hetero.framework.policy.fields import (
    Frozen,
    Name,
    NonNegativeInt,
    PositiveBytes,
    PositiveFloat,
    PositiveInt,
    freeze,
)

# --- partitions --------------------------------------------------------------------------------


CLASSIFICATIONS = ("public", "internal", "confidential", "secret")
Classification = Literal["public", "internal", "confidential", "secret"]
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
ClockTime = Annotated[StrictStr, Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]


class AttributeRule(Frozen):
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


class AccessHours(Frozen):
    """When a partition may be accessed: days of the week and a daily window, in the site's
    time zone given as an offset from UTC (China Standard Time is +8)."""

    days: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
    start: ClockTime = "00:00"
    end: ClockTime = "23:59"
    utc_offset_hours: Annotated[float, Field(ge=-12.0, le=14.0)] = 8.0


AttestationKind = Literal["sev-snp", "tdx", "sgx", "csv", "nvidia"]
# a measurement or signer in hex: up to TDX's MRTD and RTMR0-3 (5 x 48 bytes)
HexDigest = Annotated[StrictStr, Field(pattern=r"^[0-9a-fA-F]{32,480}$")]


class AttestationPolicy(Frozen):
    """What a partition's sandbox must prove with hardware evidence before it gets the
    partition's keys (checked by ``hetero.sandbox.attestation``): the evidence kinds accepted,
    the measurements or signers allowed (one of the two lists at least), the minimum TCB parts
    (``bl``, ``tee``, ``snp``, ``ucode``, ``fmc`` for SEV-SNP; ``pcesvn`` for SGX and TDX), the
    TCB statuses accepted (Intel's names; ``OK`` for vendors without one), and whether a
    debuggable guest is accepted (never by default)."""

    kinds: tuple[AttestationKind, ...] = Field(min_length=1)
    measurements: tuple[HexDigest, ...] = ()
    signers: tuple[HexDigest, ...] = ()
    min_tcb: Annotated[Mapping[Name, NonNegativeInt], AfterValidator(freeze)] = pmap()
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


class PartitionConfig(Frozen):
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


class MaskingConfig(Frozen):
    """Field-level masking of outputs: each kind of field is masked unless the caller holds one
    of the roles listed for it."""

    enabled: StrictBool = True
    clear_for: Annotated[Mapping[MaskedField, tuple[Name, ...]], AfterValidator(freeze)] = pmap()


class AuditConfig(Frozen):
    """The signed, hash-chained audit log."""

    path: Name = "~/.local/state/hetero/audit.log"
    hash: Literal["sha256", "sm3"] = "sha256"
    signing_key: Name = "~/.config/hetero/audit-signing.pem"
    checkpoint_every: PositiveInt = 100
    checkpoint_interval_s: PositiveFloat = 5.0
    max_checkpoint_age_s: PositiveFloat = 60.0
    anchor: Name | None = None


RuntimeName = Literal["kata", "gvisor", "containerd", "runc", "bwrap"]


class SandboxConfig(Frozen):
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
