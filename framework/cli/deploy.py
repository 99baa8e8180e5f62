"""``hetero deploy k8s POLICY [--out DIR]``: the policy rendered as Kubernetes manifests."""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from rich.console import Console

from hetero.framework.k8s import (
    ACCELERATORS,
    KubeOptions,
    parse_accelerator,
    render,
    write_manifests,
)
from hetero.framework.k8s.objects import dump_all
from hetero.framework.policy import BUILTIN_PREFIX, builtin_policy_text, load_policy
from hetero.framework.registry import Registry
from hetero.framework.stage_plugin import stage_kind, stage_plugins

__all__ = ["add_deploy_parser", "run_deploy"]


def _default_image() -> str:
    try:
        release = version("hetero")
    except PackageNotFoundError:
        release = "latest"
    return f"localhost/hetero:{release}"


def add_deploy_parser(commands: Any) -> None:
    """The ``deploy`` subcommand's arguments."""
    deploy = commands.add_parser("deploy", help="render deployment manifests from a policy")
    targets = deploy.add_subparsers(dest="deploy_target", required=True, metavar="TARGET")
    k8s = targets.add_parser(
        "k8s",
        help="Kubernetes manifests (plain YAML, one object per file, for kubectl apply -f)",
    )
    k8s.add_argument("policy", help="policy file, or builtin:<name>")
    k8s.add_argument("--out", help="folder to write one file per object (default: stdout)")
    k8s.add_argument("--name", default="hetero", help="release name, prefix of every object")
    k8s.add_argument("--namespace", default="hetero", help="namespace (default hetero)")
    k8s.add_argument(
        "--image", default=_default_image(), help="hetero's image (default %(default)s)"
    )
    k8s.add_argument(
        "--engine",
        choices=["embedded", "ray"],
        help="one Deployment, or a KubeRay RayCluster (default: the policy's cluster.engine)",
    )
    k8s.add_argument(
        "--accelerator",
        action="append",
        default=[],
        metavar="KIND=COUNT",
        help=f"accelerators per pod, repeatable; KIND one of {', '.join(ACCELERATORS)}",
    )
    k8s.add_argument("--workers", type=int, default=1, help="Ray workers per accelerator kind")
    k8s.add_argument("--storage-class", help="StorageClass of the state and disk-tier volumes")
    k8s.add_argument(
        "--partition-storage-class",
        help="StorageClass of the partition volumes (an encrypting one for sensitive data)",
    )
    k8s.add_argument("--partition-size", default="10Gi", help="size of each partition volume")


def _policy_text(path: str) -> str:
    if path.startswith(BUILTIN_PREFIX):
        return builtin_policy_text(path[len(BUILTIN_PREFIX) :])
    return Path(path).read_text(encoding="utf-8")


def run_deploy(out: Console, err: Console, registry: Registry, args: argparse.Namespace) -> int:
    """Render the manifests ``args`` asks for: to ``--out`` or to stdout."""
    options = KubeOptions(
        name=args.name,
        namespace=args.namespace,
        image=args.image,
        engine=args.engine,
        accelerators=tuple(parse_accelerator(text) for text in args.accelerator),
        workers=args.workers,
        storage_class=args.storage_class,
        partition_storage_class=args.partition_storage_class,
        partition_size=args.partition_size,
    )
    policy = load_policy(args.policy)  # file and line of any error, exit 2
    text = _policy_text(args.policy)
    sensitive = {n: s for n, s in policy.spec.stages.items() if s.partition is not None}
    kinds: dict[str, str] = {}
    if sensitive:
        classes = stage_plugins(registry)
        for stage_name, stage in sensitive.items():
            kinds[stage_name] = stage_kind(stage_name, stage.model_version, classes) or stage_name
    rendered = render(policy, text, options, kinds)
    if args.out is None:
        out.file.write(dump_all(list(rendered.manifests)))
    else:
        written = write_manifests(rendered, Path(args.out))
        err.print(
            f"wrote {len(written)} manifests to {args.out} ({rendered.engine} engine); "
            f"review them, then: kubectl apply -f {args.out}",
            highlight=False,
            markup=False,
        )
    for secret in rendered.secrets:
        err.print(
            f"needs Secret {secret.name} (key {secret.key}): {secret.why}",
            highlight=False,
            markup=False,
        )
    return 0
