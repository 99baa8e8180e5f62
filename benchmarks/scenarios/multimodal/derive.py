"""Derive the multimodal scenario's workload from the public Azure LLM inference trace 2023.

Run once (``python benchmarks/scenarios/multimodal/derive.py [--rate R]``) with
``../shared/data/traces/azure_llm_2023/`` beside the repository; it writes ``workload.yaml``
next to this file, which the scenario then uses on its own (no trace needed at run time).

What comes from the trace (conversation file, 19,366 requests over one hour, CC-BY-4.0):

* arrivals: gamma inter-arrival gaps with the trace's coefficient of variation (its rate is
  scaled to ``--rate``: the trace's own 5.5 requests a second would leave the fleet idle);
* prompt and output lengths: the trace's marginal distributions as quantile bins, each bin
  weighted by its share of requests and represented by its median. The two lengths are drawn
  independently: their log-correlation in the trace is 0.09.

What does not: no trace under ``../shared/data/traces`` records image sizes, so the image
question requests carry one image of either 336 x 336 pixels (CLIP ViT-L/14 at 336 px, as
LLaVA-1.5 feeds it) or 672 x 672 (LLaVA-NeXT's largest any-resolution grid), half and half:
an assumption, stated in the workload file.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TRACE = HERE.parents[2].parent / "shared" / "data" / "traces" / "azure_llm_2023"
PROMPT_BINS = 4  # quartiles of the prompt length
OUTPUT_BINS = 3  # terciles of the output length
IMAGES = ((112896, 0.5), (451584, 0.5))  # pixels, share: assumed (no trace has them)
IMAGE_SHARE = 0.6  # image question answering; the rest text chat, both with the trace's lengths


def _read(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    times = np.array([dt.datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows])
    prompt = np.array([int(r["ContextTokens"]) for r in rows])
    output = np.array([int(r["GeneratedTokens"]) for r in rows])
    return times - times[0], prompt, output


def _bins(values: np.ndarray, count: int) -> list[tuple[int, float]]:
    """``count`` quantile bins: each bin's median and its share of the values."""
    edges = np.quantile(values, np.linspace(0, 1, count + 1))
    out = []
    for position in range(count):
        low, high = edges[position], edges[position + 1]
        last = position == count - 1
        inside = values[(values >= low) & ((values <= high) if last else (values < high))]
        out.append((int(np.median(inside)), inside.size / values.size))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=60.0, help="requests per second")
    parser.add_argument("--trace", type=Path, default=TRACE / "AzureLLMInferenceTrace_conv.csv")
    args = parser.parse_args()
    times, prompt, output = _read(args.trace)
    gaps = np.diff(times)
    cv = float(gaps.std() / gaps.mean())
    log_corr = float(np.corrcoef(np.log(prompt), np.log(output))[0, 1])
    prompts, outputs = _bins(prompt, PROMPT_BINS), _bins(output, OUTPUT_BINS)
    lines = [
        "# Multimodal scenario derived from the Azure LLM inference trace 2023 (conversation file,",
        f"# CC-BY-4.0) by derive.py: gamma arrivals with the trace's gap CV ({cv:.3f}; its rate",
        f"# {times.size / times[-1]:.2f}/s scaled to {args.rate:g}/s), prompt lengths in "
        f"{PROMPT_BINS} quantile bins and output",
        f"# lengths in {OUTPUT_BINS} (each bin's median, weighted by its share; drawn "
        f"independently, log-correlation {log_corr:.2f}).",
        "# Image sizes are NOT from a trace (none here records them): one image of 336 x 336 or",
        "# 672 x 672 pixels, half and half (LLaVA-1.5's input and LLaVA-NeXT's largest grid).",
        "name: multimodal",
        "seed: 1",
        "duration_s: 180",
        "warmup_s: 30",
        f"arrivals: {{kind: gamma, rate_per_s: {args.rate:g}, cv: {cv:.3f}}}",
        "stage_nominal:",
        "  text_embed: {text_tokens: 256}",
        "mix:",
    ]
    for text_tokens, p_share in prompts:
        for output_tokens, o_share in outputs:
            for pixels, i_share in IMAGES:
                weight = IMAGE_SHARE * p_share * o_share * i_share
                lines.append(
                    f"  - {{route: /v1/image/question, weight: {weight:.5f}, qos: interactive, "
                    f"text_tokens: {text_tokens}, output_tokens: {output_tokens}, images: 1, "
                    f"image_pixels: {pixels}}}"
                )
            weight = (1 - IMAGE_SHARE) * p_share * o_share
            lines.append(
                f"  - {{route: /v1/chat/completions, weight: {weight:.5f}, qos: standard, "
                f"text_tokens: {text_tokens}, output_tokens: {output_tokens}}}"
            )
    (HERE / "workload.yaml").write_text("\n".join(lines) + "\n")
    print(f"wrote {HERE / 'workload.yaml'}: cv {cv:.3f}, prompts {prompts}, outputs {outputs}")


if __name__ == "__main__":
    main()
