"""The conformance reference graphs as torch modules, for devices that run torch graphs and not
ONNX (``npu:torch/cpu``, GPUs without ONNX Runtime's GPU provider).

Each module computes what its ONNX twin computes, with the ONNX file's own initializers, and
returns its outputs under the ONNX output names; the suite compares them with ONNX Runtime's
CPU results like any other device's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["torch_factory"]


def _initializers(source: bytes) -> dict[str, np.ndarray[Any, Any]]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string(source)
    return {init.name: numpy_helper.to_array(init).copy() for init in model.graph.initializer}


def _module(name: str, weights: dict[str, np.ndarray[Any, Any]]) -> Any:
    import torch
    from torch.nn import functional

    def mlp(w: dict[str, Any], x: Any) -> dict[str, Any]:
        logits = torch.relu(x @ w["w1"] + w["b1"]) @ w["w2"]
        return {"probs": torch.softmax(logits, dim=-1), "label": logits.argmax(dim=-1)}

    def conv(w: dict[str, Any], x: Any) -> dict[str, Any]:
        c = torch.relu(functional.conv2d(x, w["w"], w["b"], padding=1))
        pooled = functional.max_pool2d(c, kernel_size=2, stride=2)
        return {"y": pooled.mean(dim=(2, 3))}

    def broadcast(w: dict[str, Any], a: Any, b: Any, c: Any) -> dict[str, Any]:
        s = a * b + c
        return {"y": torch.sigmoid(torch.tanh(s)), "z": torch.sqrt(torch.abs(s))}

    def layernorm_gemm(w: dict[str, Any], x: Any) -> dict[str, Any]:
        n = functional.layer_norm(x, (16,), w["gamma"], w["beta"], eps=1e-5)
        g = n.reshape(-1, 16) @ w["w"].T + w["bias"]
        return {"y": g.reshape(5, -1, 24).transpose(0, 1)}

    def reductions(w: dict[str, Any], x: Any) -> dict[str, Any]:
        mean = x.mean(dim=1, keepdim=True)
        top = x.amax(dim=1, keepdim=True)
        return {"y": torch.cat([mean, top, x - mean], dim=1)}

    forwards: dict[str, Callable[..., dict[str, Any]]] = {
        "mlp": mlp,
        "conv": conv,
        "broadcast": broadcast,
        "layernorm_gemm": layernorm_gemm,
        "reductions": reductions,
    }
    forward = forwards[name]

    class Reference(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for key, value in weights.items():  # buffers: they move, and are counted, with it
                self.register_buffer(key, torch.from_numpy(value))

        def forward(self, **inputs: Any) -> dict[str, Any]:
            return forward(dict(self.named_buffers()), **inputs)

    return Reference()


def torch_factory(name: str, onnx_source: bytes) -> Callable[[], Any]:
    """A zero-argument factory of the torch twin of reference graph ``name``."""
    return lambda: _module(name, _initializers(onnx_source))
