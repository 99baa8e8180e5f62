"""GPU detection on a host without GPUs: clear reasons, nothing printed, no exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetero.backends.cuda.detect import detect as detect_cuda
from hetero.backends.rocm.detect import detect as detect_rocm

pytestmark = pytest.mark.skipif(
    Path("/dev/nvidiactl").exists() or Path("/dev/kfd").exists(),
    reason="a GPU driver is present: these tests cover hosts without one",
)


def test_cuda_reports_missing_nvml() -> None:
    detection = detect_cuda()
    assert not detection.available
    assert detection.reason == "NVML library not found"


def test_rocm_reports_missing_amdsmi_and_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    detection = detect_rocm()
    detect_rocm()  # a failed import is not cached: it must stay quiet the second time too
    out, _ = capfd.readouterr()
    assert not detection.available
    assert detection.reason == "amdsmi library not found"
    assert out == ""
