"""What ``hetero serve``, ``run`` and ``demo`` share when they start: the policy's compliance
gate and sandboxes, and a progress line per stage while the engine loads them."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from hetero.framework.policy import Policy

__all__ = ["compliance_for", "load_with_progress"]


def load_with_progress(runtime: Any, err: Console) -> None:
    """Start ``runtime``, showing one progress line per stage while models load."""
    plan = runtime.plan()
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        overall = progress.add_task("loading models", total=len(plan))
        tasks = {name: progress.add_task(f"{name}: waiting", total=None) for name, _ in plan}

        def report(stage: str, message: str) -> None:
            task = tasks.get(stage)
            if task is None:
                return
            progress.update(task, description=f"{stage}: {message}")
            if message.startswith(("ready", "failed")):
                progress.update(task, total=1, completed=1)
                progress.advance(overall)

        runtime.start(report)


def compliance_for(policy: Policy) -> tuple[Any, Any]:
    """The policy's compliance gate and sandbox provider; (None, None) without partitions.
    Stages with a partition run only inside their partition's sandbox."""
    if not policy.spec.partitions:
        return None, None
    from hetero.sandbox.serving import SandboxedStages, build_gate

    gate = build_gate(policy)
    return gate, SandboxedStages(policy, gate)
