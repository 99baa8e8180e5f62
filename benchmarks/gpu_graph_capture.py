"""CUDA Graph replay against eager for a small-batch vision-encoder-sized graph (GPU hosts).

Run by ``benchmarks/gpu_check.sh``. Prints the median latency of both, measured interleaved in
one run, and their ratio. Needs a CUDA (or ROCm) build of torch and a GPU.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from hetero.framework.executors.torch_executor import TorchExecutor

REPEATS = 200


def encoder() -> torch.nn.Module:
    """About EfficientNet-Lite0's size: a few depthwise-separable blocks on 224 x 224 input."""
    layers: list[torch.nn.Module] = [
        torch.nn.Conv2d(3, 32, 3, stride=2, padding=1),
        torch.nn.ReLU6(),
    ]
    channels = 32
    for out, stride in ((64, 2), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
        layers += [
            torch.nn.Conv2d(channels, channels, 3, stride=stride, padding=1, groups=channels),
            torch.nn.BatchNorm2d(channels),
            torch.nn.ReLU6(),
            torch.nn.Conv2d(channels, out, 1),
            torch.nn.BatchNorm2d(out),
            torch.nn.ReLU6(),
        ]
        channels = out
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(channels, 1280)]
    body = torch.nn.Sequential(*layers)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = body

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return self.body(image)

    return Encoder()


def main() -> None:
    executor = TorchExecutor("cuda:0", memory_in_use=lambda: int(torch.cuda.memory_reserved(0)))
    module, size = executor.load(executor.prepare(encoder))
    for batch in (1, 4):
        image = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
        captured, reason = executor.capture(module, {"image": image})
        if captured is None:
            print(f"batch {batch}: capture failed: {reason}")
            continue
        eager_s, graph_s = [], []
        for _ in range(REPEATS):
            for sink, graph in ((eager_s, None), (graph_s, captured)):
                started = time.perf_counter()
                executor.run(module, {"image": image}, graph)
                executor.synchronize()
                sink.append(time.perf_counter() - started)
        eager, replay = statistics.median(eager_s), statistics.median(graph_s)
        same = np.allclose(
            executor.run(module, {"image": image})["output"],
            executor.run(module, {"image": image}, captured)["output"],
            rtol=1e-4,
            atol=1e-4,
        )
        print(
            f"batch {batch}: eager {eager * 1e3:.3f} ms, graph replay {replay * 1e3:.3f} ms, "
            f"eager/replay {eager / replay:.2f}x, outputs equal: {same}, "
            f"model {size / 2**20:.1f} MiB"
        )
    executor.unload(module)


if __name__ == "__main__":
    main()
