"""On a CUDA host: the default policy's stages warmed up through the engine with ``cuda:0`` in
the fleet, and per stage the warm-up latency on each device (``cuda:0`` against the host's
runtimes) and where the scheduler placed it. Stages whose model packages the host lacks are
reported with their reason. Run by ``benchmarks/gpu_check.sh``; prints JSON."""

from __future__ import annotations

import json
import sys

from hetero.framework.policy import builtin_policy_text, load_policy_text
from hetero.framework.server import Serving


def main() -> int:
    text = builtin_policy_text("default").replace("allow: [cpu, npu]", "allow: [cuda, cpu, npu]")
    serving = Serving(load_policy_text(text, "default+cuda"), use_cache=False)
    try:
        serving.start(lambda stage, message: print(f"{stage}: {message}", file=sys.stderr))
        report = {
            "stages": {
                row["stage"]: {
                    "placed_on": row["resident_on"],
                    "warmup_s_by_device": row["warmup_timings_s"],
                }
                for row in serving.describe()
            },
            "failed": {name: failure.reason for name, failure in serving.failed.items()},
            "unserved": dict(serving.unserved),
        }
    finally:
        serving.close()
    print(json.dumps(report, indent=2))
    on_gpu = [s for s, r in report["stages"].items() if "cuda:0" in r["placed_on"]]
    print(f"stages placed on cuda:0: {on_gpu or 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
