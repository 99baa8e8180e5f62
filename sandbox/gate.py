"""The compliance gate the server and engine call around every sensitive stage.

Before dispatch: :meth:`ComplianceGate.authorize` decides (RBAC + attribute rules, purpose, access
hours; deny by default, anonymous callers refused) and writes the decision to the audit log,
refusals included. After: :meth:`ComplianceGate.mask` masks the output field by field for the
caller's roles. The audit records carry names, rules and object ids, never content.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from hetero.framework.errors import HeteroError
from hetero.framework.policy import Policy
from hetero.sandbox.access import AccessDecision, Principal, decide
from hetero.sandbox.audit import AuditLog
from hetero.sandbox.masking import mask_for_roles

__all__ = ["AccessDeniedError", "ComplianceGate"]


class AccessDeniedError(HeteroError, PermissionError):
    """A principal may not use a sensitive stage; the message names the deciding rule.

    Attributes:
        decision: The decision, with its rule and reason.
    """

    def __init__(self, stage: str, decision: AccessDecision) -> None:
        super().__init__(f"access to stage {stage!r} denied by {decision.rule}: {decision.reason}")
        self.decision = decision


class ComplianceGate:
    """Access decisions, audit records and masking for one policy."""

    def __init__(
        self,
        policy: Policy,
        audit: AuditLog,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.policy = policy
        self.audit = audit
        self.clock = clock

    def partition_of(self, stage: str) -> str | None:
        """The partition a stage touches, if any."""
        config = self.policy.spec.stages.get(stage)
        return None if config is None else config.partition

    def authorize(self, principal: Principal | None, stage: str, request_id: str) -> None:
        """Allow or refuse ``principal`` on ``stage``; either way the decision is audited."""
        partition_name = self.partition_of(stage)
        if partition_name is None:
            return
        partition = self.policy.spec.partitions[partition_name]
        if principal is None:
            decision = AccessDecision(
                False, "default-deny", "anonymous callers may not use sensitive partitions"
            )
        else:
            decision = decide(principal, partition_name, partition, self.clock())
        self.audit.append(
            "access",
            principal=principal.name if principal is not None else "anonymous",
            partition=partition_name,
            decision="allow" if decision.allowed else "deny",
            detail={
                "stage": stage,
                "request": request_id,
                "rule": decision.rule,
                "reason": decision.reason,
            },
        )
        if not decision.allowed:
            raise AccessDeniedError(stage, decision)

    def mask(self, principal: Principal | None, stage: str, value: Any) -> Any:
        """``value`` with ID, mobile, bank card and e-mail fields masked unless the caller's
        roles are cleared for them (masking applies to every stage's output)."""
        masking = self.policy.spec.masking
        if not masking.enabled:
            return value
        roles = principal.roles if principal is not None else frozenset()
        clearances = {str(kind): roles_ for kind, roles_ in masking.clear_for.items()}
        return mask_for_roles(value, roles, clearances)

    def record(self, kind: str, *, partition: str = "", **detail: Any) -> None:
        """Audit a sandbox start/stop, key use or erasure."""
        self.audit.append(kind, partition=partition, detail=detail)

    def close(self) -> None:
        """Write the audit log's final checkpoint (after the sandboxes have stopped)."""
        self.audit.close()
