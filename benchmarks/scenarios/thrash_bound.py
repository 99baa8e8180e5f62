"""Why the thrash goal cannot be met as stated, and the trade-off hetero offers instead.

``python benchmarks/scenarios/thrash_bound.py`` prints, for the thrash scenario's arrivals:

1. A lower bound on the loads of ANY memory manager whose longest queue wait is at most ``W``
   (taken as plain LRU's, measured in the same run). At any instant at least
   ``models - fit`` models are absent (neither resident nor loading). Whichever they are, the
   first request to one of them after time ``t`` arrives no later than ``a(t)``, the
   ``(fit + 1)``-th smallest "next arrival after ``t``" over the models; its load must start
   by ``a(t) + W``. So one load starts in every epoch ``[t_k, t_{k+1})`` with
   ``t_{k+1} = a(t_k) + W``: counting epochs counts loads from below, generously (requests
   arriving inside an epoch are ignored, and loads take no time).
2. hetero under a sweep of ``max_load_wait_s`` (the residency bound): loads per hour, p99 and
   the longest wait, side by side with LRU on identical arrivals.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from pathlib import Path
from typing import Any

from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.arrivals import open_loop_requests
from hetero.framework.simulator.report import compare, table_rows

HERE = Path(__file__).resolve().parent / "thrash"
SWEEP_S = (1.0, 1.75, 3.0, 5.0, 10.0, 45.0)


def load_lower_bound(policy: Policy, max_wait_s: float, fit: int) -> float:
    """Loads per hour any manager needs to keep every wait within ``max_wait_s``."""
    workload = load_workload(HERE / "workload.yaml")
    spec = workload.spec
    times: dict[str, list[float]] = defaultdict(list)
    for request in open_loop_requests(workload, policy):
        times[request.route].append(request.arrival)
    routes = sorted(policy.spec.routes)
    now, epochs = spec.warmup_s, 0
    while True:
        upcoming = sorted(
            series[i] if (i := bisect.bisect_right(series, now)) < len(series) else float("inf")
            for series in (times[r] for r in routes)
        )
        first_absent = upcoming[fit]
        if first_absent > spec.duration_s:
            break
        epochs += 1
        now = first_absent + max_wait_s
    return epochs / ((spec.duration_s - spec.warmup_s) / 3600.0)


def sweep() -> list[dict[str, Any]]:
    """hetero at each residency bound, and LRU, on the scenario's arrivals."""
    text = (HERE / "policy.yaml").read_text()
    workload = load_workload(HERE / "workload.yaml")
    rows = []
    for bound in SWEEP_S:
        policy = load_policy_text(
            text.replace("max_load_wait_s: 1.75", f"max_load_wait_s: {bound}"), "thrash.yaml"
        )
        fleet = resolve_fleet(policy, Registry(use_entry_points=False))
        names = ["hetero", "lru"] if bound == SWEEP_S[0] else ["hetero"]
        for row in table_rows(compare(policy, fleet, workload, names)):
            row["max_load_wait_s"] = bound if row["policy"] == "hetero" else None
            rows.append(row)
    return rows


def main() -> None:
    policy = load_policy_text((HERE / "policy.yaml").read_text(), "thrash.yaml")
    rows = sweep()
    lru = next(r for r in rows if r["policy"] != "hetero")
    fit = 3
    bound = load_lower_bound(policy, lru["lowest_class_max_wait_s"], fit)
    print("| policy | max_load_wait_s | loads/h | x LRU | mean ms | p99 ms | max wait s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['policy']} | {row['max_load_wait_s'] or '-'} | {row['loads_per_hour']:.0f}"
            f" | {row['loads_per_hour'] / lru['loads_per_hour']:.2f} | {row['mean_ms']:.0f}"
            f" | {row['p99_ms']:.0f} | {row['lowest_class_max_wait_s']:.2f} |"
        )
    print(
        f"\nAny manager whose longest wait is within LRU's ({lru['lowest_class_max_wait_s']:.2f} s)"
        f" needs at least {bound:.0f} loads per hour here: {bound / lru['loads_per_hour']:.2f}x"
        " LRU's, so loads <= 0.1x LRU together with LRU's longest wait is out of reach."
    )


if __name__ == "__main__":
    main()
