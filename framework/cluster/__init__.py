"""Beyond one machine: the engine's devices on every node of a Ray cluster.

A policy with ``cluster: {engine: ray, address: auto | ray://host:port}`` runs the same engine,
scheduler and HTTP front door over the devices of every node (``ray_cluster``); the node side is
``agent``. ``ray`` is imported only here, and only when such a policy is used: the embedded
default never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero.framework.policy.schema import ClusterConfig

if TYPE_CHECKING:
    from hetero.framework.cluster.ray_cluster import RayCluster
    from hetero.framework.registry import Registry

__all__ = ["connect", "register"]


def connect(config: ClusterConfig) -> RayCluster:
    """The connection to the policy's Ray cluster (``hetero[ray]``), made once per process."""
    from hetero.framework.cluster.ray_cluster import connect as connect_ray

    return connect_ray(config)


def register(registry: Registry) -> None:
    """Entry point ``hetero.plugins: ray``: :func:`connect` as the cluster engine ``ray``, which
    :mod:`hetero.framework.fleet` asks for when a policy sets ``cluster.engine: ray`` (the fleet
    is below the engine and this package above it, so the fleet never imports it)."""
    from hetero.framework.fleet import CLUSTER_ENGINE

    registry.register(CLUSTER_ENGINE, "ray", connect)
