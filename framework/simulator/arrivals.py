"""Arrival sequences from a workload, reproducible from its seed."""

from __future__ import annotations

import numpy as np

from hetero.framework.errors import PolicyValidationError
from hetero.framework.policy import Policy
from hetero.framework.simulator.traces import read_azure, read_trace
from hetero.framework.simulator.workload import RequestKind, SimRequest, Workload

__all__ = [
    "RequestSource",
    "check_against_policy",
    "open_loop_requests",
    "request_from_kind",
]


def request_from_kind(kind: RequestKind, index: int, arrival: float) -> SimRequest:
    """A request of ``kind`` arriving at ``arrival``."""
    return SimRequest(
        index=index,
        arrival=arrival,
        route=kind.route,
        qos=kind.qos,
        text_tokens=kind.text_tokens,
        output_tokens=kind.output_tokens,
        images=kind.images,
        image_pixels=kind.image_pixels,
        audio_seconds=kind.audio_seconds,
        tenant=kind.tenant,
    )


def _cdf(weights: np.ndarray) -> np.ndarray:
    """The cumulative distribution of drawing each index by its weight (numpy's own
    normalisation: probabilities, their running sum, divided by its last entry)."""
    if not len(weights):
        return weights
    cdf: np.ndarray = (weights / weights.sum()).cumsum()
    cdf /= cdf[-1]
    return cdf


class RequestSource:
    """Draws request kinds from the mix, and arrival gaps, with the workload's seed."""

    def __init__(self, workload: Workload, stream: int | None = None) -> None:
        self.spec = workload.spec
        # A closed-loop client draws from its own stream, so its requests do not depend on the
        # order in which other clients finish (which differs between placement policies).
        seed = self.spec.seed if stream is None else [self.spec.seed, stream]
        self.rng = np.random.default_rng(seed)
        weights = np.array([k.weight for k in self.spec.mix], dtype=float)
        self._cdf = _cdf(weights)

    def kind(self, only: str | None = None) -> RequestKind:
        """A kind drawn by weight (``only``: ``images`` or ``audio`` restricts the draw)."""
        kinds = list(self.spec.mix)
        cdf = self._cdf
        if only is not None:
            keep = [
                (images if only == "images" else audio)
                for images, audio in ((k.images > 0, k.audio_seconds > 0) for k in kinds)
            ]
            kinds = [k for k, flag in zip(kinds, keep, strict=True) if flag]
            if not kinds:
                raise ValueError(f"the mix has no {only} requests to mix in")
            cdf = _cdf(np.array([k.weight for k in kinds], dtype=float))
        # Inverse transform of one uniform draw: the draws of ``rng.choice(n, p=...)``, which
        # does the same after checking p, in an eighth of its 12 us.
        return kinds[int(cdf.searchsorted(self.rng.random(), side="right"))]

    def gap(self) -> float:
        """Seconds to the next open-loop arrival."""
        arrivals = self.spec.arrivals
        assert arrivals.rate_per_s is not None
        if arrivals.kind == "gamma":
            shape = 1.0 / (arrivals.cv**2)
            return float(self.rng.gamma(shape, 1.0 / (arrivals.rate_per_s * shape)))
        return float(self.rng.exponential(1.0 / arrivals.rate_per_s))


def check_against_policy(workload: Workload, policy: Policy) -> None:
    """Every route and QoS class the workload names exists in the policy."""
    spec = workload.spec
    routes = set(policy.spec.routes)
    classes = set(policy.spec.qos.classes)

    def fail(key: str, problem: str) -> PolicyValidationError:
        return PolicyValidationError(str(workload.source), None, key, problem)

    for index, kind in enumerate(spec.mix):
        if kind.route not in routes:
            raise fail(f"mix[{index}].route", f"{kind.route!r} is not a route of the policy")
        if kind.qos is not None and kind.qos not in classes:
            raise fail(f"mix[{index}].qos", f"{kind.qos!r} is not a QoS class of the policy")
    if spec.azure is not None:
        if spec.azure.route not in routes:
            raise fail("azure.route", f"{spec.azure.route!r} is not a route of the policy")
        if spec.azure.qos is not None and spec.azure.qos not in classes:
            raise fail("azure.qos", f"{spec.azure.qos!r} is not a QoS class of the policy")


def open_loop_requests(workload: Workload, policy: Policy) -> list[SimRequest]:
    """Every request of a poisson, gamma, trace or azure workload, sorted by arrival."""
    spec = workload.spec
    check_against_policy(workload, policy)
    routes = set(policy.spec.routes)
    source = RequestSource(workload)
    base = workload.source.parent
    if spec.arrivals.kind == "trace":
        assert spec.arrivals.path is not None
        rows = read_trace(base / spec.arrivals.path, routes, spec.arrivals.limit)
        classes = set(policy.spec.qos.classes)
        for row in rows:
            if row.qos is not None and row.qos not in classes:
                raise PolicyValidationError(
                    str(base / spec.arrivals.path), None, "qos", f"{row.qos!r} is not a QoS class"
                )
        return [row for row in rows if row.arrival <= spec.duration_s]
    if spec.arrivals.kind == "azure":
        assert spec.arrivals.path is not None and spec.azure is not None
        requests = []
        for index, (arrival, context, generated) in enumerate(
            read_azure(base / spec.arrivals.path, spec.arrivals.limit)
        ):
            if arrival > spec.duration_s:
                break
            draw = float(source.rng.random())
            if draw < spec.azure.image_ratio:
                requests.append(request_from_kind(source.kind("images"), index, arrival))
            elif draw < spec.azure.image_ratio + spec.azure.audio_ratio:
                requests.append(request_from_kind(source.kind("audio"), index, arrival))
            else:
                requests.append(
                    SimRequest(index, arrival, spec.azure.route, spec.azure.qos, context, generated)
                )
        return requests
    requests = []
    now = source.gap()
    while now <= spec.duration_s:
        requests.append(request_from_kind(source.kind(), len(requests), now))
        now += source.gap()
    return requests
