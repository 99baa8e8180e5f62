"""A partition's measurement policy applied to a verified :class:`Verdict`."""

from __future__ import annotations

from hetero.framework.policy.schema import AttestationPolicy
from hetero.sandbox.attestation.common import Verdict

__all__ = ["apply_policy"]


def apply_policy(verdict: Verdict, policy: AttestationPolicy, partition: str) -> Verdict:
    """``verdict`` if it meets ``policy``, else refused with the first unmet rule."""
    if not verdict.verified:
        return verdict
    where = f"partition {partition!r}"
    if verdict.kind not in policy.kinds:
        return verdict.refused(
            f"{where} accepts {', '.join(policy.kinds)} evidence, not {verdict.kind}"
        )
    if verdict.debug and not policy.allow_debug:
        return verdict.refused(
            f"the guest is debuggable (debug policy bit set); {where} refuses that"
        )
    allowed = {m.lower() for m in policy.measurements}
    signers = {s.lower() for s in policy.signers}
    by_measurement = verdict.measurement.lower() in allowed
    by_signer = bool(verdict.signer) and verdict.signer.lower() in signers
    if not (by_measurement or by_signer):
        return verdict.refused(
            f"measurement {verdict.measurement[:24]}... is not one {where} allows"
            + (" (nor is its signer)" if signers else "")
        )
    parts = dict(verdict.tcb_parts)
    for name, minimum in sorted(policy.min_tcb.items()):
        if name not in parts:
            return verdict.refused(
                f"{where} sets a minimum {name}, which {verdict.kind} evidence does not report"
            )
        if parts[name] < minimum:
            return verdict.refused(f"TCB {name}={parts[name]} is below {where}'s minimum {minimum}")
    if verdict.status not in policy.tcb_statuses:
        return verdict.refused(
            f"TCB status {verdict.status} is not one {where} accepts "
            f"({', '.join(policy.tcb_statuses)})"
        )
    return verdict
