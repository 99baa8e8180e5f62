"""``hetero sandbox check|erase|expire``: what isolation this host gives each partition, and
the data-subject erasure and retention commands."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from hetero.framework.output import print_json
from hetero.framework.policy import load_policy


def run_sandbox_check(console: Console, policy_path: str, as_json: bool = False) -> int:
    """Print runtimes and partitions; exit 0 when every partition can be satisfied, else 1."""
    from hetero.sandbox.selection import check_policy

    policy = load_policy(policy_path)
    report = check_policy(policy)
    if as_json:
        print_json(console, {"policy": policy_path, **report.to_dict()})
        return 0 if report.ok else 1
    runtimes = Table(title="Sandbox runtimes (policy preference order)", title_justify="left")
    for column in ("runtime", "isolation", "available", "detail"):
        runtimes.add_column(column, overflow="fold")
    for runtime, found in report.runtimes:
        detail = found.detail + (f"; {found.hint}" if found.hint and not found.available else "")
        runtimes.add_row(
            runtime.name, runtime.isolation.label, "yes" if found.available else "no", detail
        )
    console.print(runtimes)
    partitions = Table(title=f"Partitions of {policy_path}", title_justify="left")
    for column in ("partition", "requires", "runtime", "cipher", "key", "verdict"):
        partitions.add_column(column, overflow="fold")
    for check in report.partitions:
        partitions.add_row(
            check.name,
            check.required,
            check.runtime or "-",
            check.cipher,
            "ok" if check.key.ok else "missing",
            "satisfied" if check.ok else "NOT satisfied: " + " | ".join(check.problems),
        )
    console.print(partitions)
    if not report.partitions:
        console.print("the policy has no partitions")
    return 0 if report.ok else 1


def _store(policy_path: str, partition: str) -> tuple[object, object]:
    from hetero.framework.errors import HeteroError
    from hetero.sandbox.keys import open_key
    from hetero.sandbox.partition_store import PartitionStore

    policy = load_policy(policy_path)
    config = policy.spec.partitions.get(partition)
    if config is None:
        known = ", ".join(sorted(policy.spec.partitions)) or "none"
        raise HeteroError(f"{policy_path}: no partition {partition!r} (partitions: {known})")
    keyring, name = open_key(config.key, policy.spec.sandbox)
    root = Path(policy.spec.sandbox.partitions_dir).expanduser()
    return PartitionStore(root, partition, keyring, name, config.cipher), config


def run_sandbox_erase(console: Console, policy_path: str, partition: str, subject: str) -> int:
    """Erase a data subject's objects from a partition."""
    from hetero.sandbox.partition_store import PartitionStore

    store, _ = _store(policy_path, partition)
    assert isinstance(store, PartitionStore)
    erased = store.erase_subject(subject)
    console.print(f"erased {len(erased)} object(s) from {partition}", highlight=False)
    for object_id in sorted(erased):
        console.print(f"  {object_id}", highlight=False)
    policy = load_policy(policy_path)
    cache_config = policy.spec.cache
    digests = sorted({d for d in erased.values() if d is not None})
    dropped = 0
    if cache_config.enabled and digests:
        from hetero.cache.feature_cache import FeatureCache

        cache = FeatureCache(cache_config)
        try:
            dropped = sum(cache.erase_content(digest) for digest in digests)
        finally:
            cache.close()
        console.print(f"dropped {dropped} derived feature-cache entr(ies)", highlight=False)
    from hetero.sandbox.erasure import audit_erasure

    record = audit_erasure(policy, partition, sorted(erased), dropped)
    console.print(f"audited: erasure record {record[:16]}", highlight=False)
    return 0


def run_sandbox_expire(console: Console, policy_path: str) -> int:
    """Delete objects past their partition's retention period."""
    from hetero.sandbox.partition_store import PartitionStore

    policy = load_policy(policy_path)
    for name, config in sorted(policy.spec.partitions.items()):
        if config.retention_days is None:
            continue
        store, _ = _store(policy_path, name)
        assert isinstance(store, PartitionStore)
        expired = store.expire(config.retention_days)
        console.print(
            f"{name}: {len(expired)} object(s) past {config.retention_days} days removed",
            highlight=False,
        )
    return 0
