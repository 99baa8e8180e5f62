"""A lower bound on ref-8xa100's mean latency for ANY placement, under continuous batching.

``python benchmarks/scenarios/ref_8xa100_bound.py`` prints it. Every figure comes from the sim
backend's one formula (:func:`modelled_run`, :func:`modelled_prefill`, :func:`modelled_steps`):

* An LLM request costs its device one prefill of its prompt and its share of 128 decode steps.
  With ``m`` sequences running, a step costs ``step(m)`` (weights read once, every sequence's
  KV cache read: at steady state each holds the prompt plus half the answer on average) and
  makes ``m`` tokens, so the request's device time is ``prefill + 128 step(m) / m``, smallest
  at the batch cap ``m = 16``. The other stages cost their batch time over their batch cap
  (vision at 32, speech-to-text at 8, text-to-speech alone).
* Eight devices bound the throughput: ``X <= 8 / sum(share x device time)``; Little's law for
  the closed loop (``clients`` clients, think time ``Z``) gives ``R = clients / X - Z``.
* A request also takes at least its own work: vision, prefill and 128 steps at ``step(m)``.

The mean is at least the larger of the two.
"""

from __future__ import annotations

from pathlib import Path

from hetero.backends.sim.timing import LlmSequences, modelled_prefill, modelled_run, modelled_steps
from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy
from hetero.framework.policy.hints import hint_from_variant
from hetero.framework.registry import Registry
from hetero.framework.simulator import load_workload

HERE = Path(__file__).resolve().parent / "ref-8xa100"


def bound() -> dict[str, float]:
    """The bound's terms, in seconds (and requests per second for the throughput)."""
    policy = load_policy(HERE / ".." / ".." / ".." / "policies" / "sim" / "8xa100.yaml")
    workload = load_workload(HERE / "workload.yaml")
    devices = resolve_fleet(policy, Registry(use_entry_points=False)).devices
    device = devices[0]
    spec = workload.spec
    hints = {}
    for name, stage in policy.spec.stages.items():
        hint = hint_from_variant(stage.variants["full"])
        assert hint is not None
        hints[name] = hint
    shares = {kind.route: kind.weight for kind in spec.mix}
    total = sum(shares.values())
    llm_kind = next(k for k in spec.mix if k.output_tokens)
    prompt, output = llm_kind.text_tokens, llm_kind.output_tokens
    nominal = spec.nominal.text_tokens
    llm = hints["llm_decode"]
    cap = llm.max_batch
    mean_context = prompt + output // 2
    step = float(modelled_steps(llm, device, [mean_context] * cap, [1] * cap, nominal)[0])
    prefill = modelled_prefill(llm, device, [prompt], nominal)
    llm_device_s = prefill + output * step / cap

    def per_item(stage: str, items: int) -> float:
        return modelled_run(hints[stage], device, items).seconds / items

    vision = per_item("vision_encode", hints["vision_encode"].max_batch)
    asr = per_item("asr", hints["asr"].max_batch)
    tts = per_item("tts", 1)
    image_share = shares["/v1/image/question"] / total
    asr_share = shares["/v1/audio/transcriptions"] / total
    tts_share = shares["/v1/audio/speech"] / total
    demand = image_share * (vision + llm_device_s) + asr_share * asr + tts_share * tts
    throughput = len(devices) / demand
    clients = spec.arrivals.clients or 0
    think = spec.arrivals.think_time_s
    little = clients / throughput - think
    alone = modelled_run(llm, device, 1, LlmSequences([prompt], [output], nominal)).seconds
    own = (
        image_share * (vision + prefill + output * step)
        + asr_share * asr
        + tts_share * per_item("tts", 1)
    )
    return {
        "llm_step_at_cap_s": step,
        "llm_prefill_s": prefill,
        "llm_device_s_per_request": llm_device_s,
        "llm_alone_s": alone,
        "throughput_max_rps": throughput,
        "little_bound_s": little,
        "own_work_bound_s": own,
        "mean_bound_s": max(little, own),
    }


def main() -> None:
    for name, value in bound().items():
        print(f"{name}: {value:.4g}")


if __name__ == "__main__":
    main()
