"""Published figures of common devices, for simulated fleets (``devices.simulated[].preset``).

Each figure comes from the vendor's datasheet named beside it. Peak tensor figures are dense
(no structured sparsity). ``interconnect_bandwidth`` is per direction between two devices of the
same kind in the vendor's reference system; ``host_bandwidth`` is per direction to host memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyrsistent import pmap

__all__ = ["PRESETS", "preset"]

GB = 1e9
TB = 1e12
T = 1e12

PRESETS: Mapping[str, Mapping[str, Any]] = pmap(
    {
        # NVIDIA A100 Tensor Core GPU datasheet (2021), SXM4 80GB column: 80 GB HBM2e,
        # 2,039 GB/s; FP32 19.5 TFLOPS; FP16/BF16 tensor 312; INT8 624 TOPS; NVLink 600 GB/s
        # (300 each way); PCIe Gen4 64 GB/s (32 each way).
        "A100-SXM4-80GB": pmap(
            {
                "class": "cuda",
                "vendor_name": "NVIDIA A100-SXM4-80GB",
                "memory": 80 * GB,
                "memory_bandwidth": 2039 * GB,
                "peak_flops": pmap(
                    {"fp32": 19.5 * T, "fp16": 312 * T, "bf16": 312 * T, "int8": 624 * T}
                ),
                "interconnect": "nvlink",
                "interconnect_bandwidth": 300 * GB,
                "host_bandwidth": 32 * GB,
            }
        ),
        # NVIDIA H100 Tensor Core GPU datasheet (2023), SXM5 column: 80 GB HBM3, 3.35 TB/s;
        # FP32 67 TFLOPS; FP16/BF16 tensor 989.4; INT8 1,978.9 TOPS; NVLink 900 GB/s;
        # PCIe Gen5 128 GB/s (64 each way).
        "H100-SXM5-80GB": pmap(
            {
                "class": "cuda",
                "vendor_name": "NVIDIA H100-SXM5-80GB",
                "memory": 80 * GB,
                "memory_bandwidth": 3.35 * TB,
                "peak_flops": pmap(
                    {"fp32": 67 * T, "fp16": 989.4 * T, "bf16": 989.4 * T, "int8": 1978.9 * T}
                ),
                "interconnect": "nvlink",
                "interconnect_bandwidth": 450 * GB,
                "host_bandwidth": 64 * GB,
            }
        ),
        # NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column: 141 GB HBM3e, 4.8 TB/s;
        # FP32 67 TFLOPS; FP16/BF16 tensor 989.5; INT8 1,979 TOPS; NVLink 900 GB/s;
        # PCIe Gen5 128 GB/s.
        "H200": pmap(
            {
                "class": "cuda",
                "vendor_name": "NVIDIA H200",
                "memory": 141 * GB,
                "memory_bandwidth": 4.8 * TB,
                "peak_flops": pmap(
                    {"fp32": 67 * T, "fp16": 989.5 * T, "bf16": 989.5 * T, "int8": 1979 * T}
                ),
                "interconnect": "nvlink",
                "interconnect_bandwidth": 450 * GB,
                "host_bandwidth": 64 * GB,
            }
        ),
        # AMD Instinct MI300X accelerator data sheet (2023): 192 GB HBM3, 5.3 TB/s; FP32 matrix
        # 163.4 TFLOPS; FP16/BF16 1,307.4; INT8 2,614.9 TOPS; Infinity Fabric (xGMI) 7 links of
        # 128 GB/s (64 each way) to the other seven GPUs of an 8-GPU platform; PCIe Gen5 x16.
        "MI300X": pmap(
            {
                "class": "rocm",
                "vendor_name": "AMD Instinct MI300X",
                "memory": 192 * GB,
                "memory_bandwidth": 5.3 * TB,
                "peak_flops": pmap(
                    {"fp32": 163.4 * T, "fp16": 1307.4 * T, "bf16": 1307.4 * T, "int8": 2614.9 * T}
                ),
                "interconnect": "xgmi",
                "interconnect_bandwidth": 64 * GB,
                "host_bandwidth": 64 * GB,
            }
        ),
        # Huawei Atlas 800T A2 / Ascend 910B as published by Huawei: 64 GB HBM2e at about
        # 1.6 TB/s; FP16 about 313 TFLOPS (FP32 a quarter of it); HCCS 392 GB/s per chip (196
        # each way); PCIe Gen5 x16.
        "Ascend-910B": pmap(
            {
                "class": "npu",
                "vendor_name": "Huawei Ascend 910B-class NPU",
                "memory": 64 * GB,
                "memory_bandwidth": 1.6 * TB,
                "peak_flops": pmap(
                    {"fp32": 78 * T, "fp16": 313 * T, "bf16": 313 * T, "int8": 626 * T}
                ),
                "interconnect": "network",
                "interconnect_bandwidth": 196 * GB,
                "host_bandwidth": 64 * GB,
            }
        ),
        # Intel Xeon Platinum 8480+ (Sapphire Rapids), Intel ARK: 56 cores, 2.0 GHz base;
        # 8 channels of DDR5-4800 = 307 GB/s; FP32 = 56 x 2.0 GHz x 64 FLOP/cycle (two AVX-512
        # FMA units) = 7.2 TFLOPS; BF16/INT8 through AMX at 1,024 / 2,048 ops/cycle/core.
        "Xeon-8480+": pmap(
            {
                "class": "cpu",
                "vendor_name": "Intel Xeon Platinum 8480+",
                "memory": 512 * 2**30,
                "memory_bandwidth": 307 * GB,
                "peak_flops": pmap({"fp32": 7.2 * T, "bf16": 114.7 * T, "int8": 229.4 * T}),
                "interconnect": "none",
            }
        ),
    }
)


def preset(name: str) -> Mapping[str, Any]:
    """The figures of preset ``name``; KeyError if unknown."""
    return PRESETS[name]
