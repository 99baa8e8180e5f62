"""A Ray device actor's options and the device id it opens, without Ray (pure functions of
``hetero.framework.cluster.lane_start``; the Ray side is tests/ray/test_gpu_resources.py)."""

from __future__ import annotations

from hetero.framework.cluster.lane_start import actor_name, lane_options, visible_device
from hetero.framework.devices import DeviceClass, DeviceSpec


def device(device_class: DeviceClass, node_gpus: float, reserved: bool = True) -> DeviceSpec:
    return DeviceSpec(
        id="cuda:1@node-12345678",
        device_class=device_class,
        vendor_name="a node's GPU (fake)",
        backend="ray",
        host="node-12345678",
        memory_bytes=2**30,
        peak_flops={"fp32": 1e12},
        memory_bandwidth_bytes_per_s=1e11,
        properties={"node_device": "cuda:1", "node_gpus": node_gpus, "reserved": reserved},
    )


def test_a_gpu_actor_holds_one_of_rays_gpus_where_the_node_gives_ray_gpus() -> None:
    options = lane_options(device(DeviceClass.CUDA, node_gpus=2), strategy=None)
    assert options["num_gpus"] == 1
    assert options["resources"] == {"hetero/cuda:1": 0.01}
    # one actor per device on the cluster, whichever front door asks first
    assert (
        options["name"] == actor_name("cuda:1@node-12345678") == "hetero-lanes:cuda:1@node-12345678"
    )
    assert options["get_if_exists"] is True and options["lifetime"] == "detached"
    # the controls: a node that gives Ray no GPUs, and a device that is not a GPU
    assert "num_gpus" not in lane_options(device(DeviceClass.CUDA, node_gpus=0), None)
    assert "num_gpus" not in lane_options(device(DeviceClass.NPU, node_gpus=2), None)
    assert "resources" not in lane_options(device(DeviceClass.CUDA, 2, reserved=False), None)


def test_the_device_id_follows_the_gpus_ray_assigned() -> None:
    assert visible_device("cuda:3", ["3"]) == "cuda:0"  # CUDA_VISIBLE_DEVICES=3
    assert visible_device("cuda:3", ["1", "3"]) == "cuda:1"
    assert visible_device("cuda:3", ["0"]) == "cuda:0"  # Ray gave another: it serves that one
    assert visible_device("cuda:3", []) == "cuda:3"  # no num_gpus: its own id
    assert visible_device("sim:a100-1", ["0"]) == "sim:a100-1"  # not an indexed GPU id
    assert visible_device("npu:openvino/CPU", ["0"]) == "npu:openvino/CPU"
