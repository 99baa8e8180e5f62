"""One import name: folders install under hetero.*, never as bare top-level packages."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGED = (
    "framework",
    "backends",
    "cache",
    "models",
    "sandbox",
    "policies",
    "setup.py",
    "pyproject.toml",
    "README.md",
)


@pytest.mark.parametrize(
    "bare", ["cache", "framework", "sandbox", "backends", "policies", "models"]
)
def test_folders_are_not_importable_as_bare_names(bare: str) -> None:
    assert importlib.util.find_spec(bare) is None


def test_hetero_is_a_namespace_without_code() -> None:
    import hetero

    assert getattr(hetero, "__file__", None) is None
    assert importlib.util.find_spec("hetero.framework") is not None
    assert importlib.util.find_spec("hetero.backends.npu") is not None


def test_the_venv_imports_each_folder_in_place_so_a_new_module_needs_no_reinstall() -> None:
    for folder in ("framework", "backends/cuda", "backends/npu", "cache", "sandbox", "models"):
        spec = importlib.util.find_spec("hetero." + folder.replace("/", "."))
        assert spec is not None and spec.submodule_search_locations is not None, folder
        (location,) = spec.submodule_search_locations
        assert Path(location).resolve() == REPO / folder


def test_built_wheel_contains_every_subpackage(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in PACKAGED:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, source / name)
    out = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from setuptools import build_meta; build_meta.build_wheel({str(out)!r})",
        ],
        cwd=source,
        env={k: v for k, v in os.environ.items() if k != "HETERO_METADATA_ONLY"},
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("hetero-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in (
        "framework",
        "backends/cuda",
        "backends/rocm",
        "backends/npu",
        "cache",
        "sandbox",
        "policies",
        "models",
    ):
        assert f"hetero/{folder}/__init__.py" in names, folder
        assert f"hetero/{folder}/py.typed" in names, folder
    for sub in ("framework/policy", "framework/cli", "framework/conformance", "framework/server"):
        assert f"hetero/{sub}/__init__.py" in names, sub
    for policy in ("default.yaml", "gov-onprem.yaml", "sim/8xa100.yaml", "sim/mixed-fleet.yaml"):
        assert f"hetero/policies/{policy}" in names, policy
    for root in ("amd_milan.pem", "intel_sgx_root_ca.der", "hygon_hrk.cert"):  # pinned roots
        assert f"hetero/sandbox/attestation/roots/{root}" in names, root
    assert "hetero/__init__.py" not in names
    assert not any(
        name.split("/")[0] in {"framework", "cache", "sandbox", "backends"} for name in names
    )


def test_the_embedded_engine_never_imports_ray() -> None:
    code = (
        "import sys\n"
        "from hetero.framework.engine import Engine\n"
        "from hetero.framework.fleet import resolve_fleet\n"
        "from hetero.framework.policy import load_policy\n"
        "from hetero.framework.registry import Registry\n"
        "import hetero.framework.cluster\n"
        "resolve_fleet(load_policy('builtin:sim/8xa100'), Registry(use_entry_points=False))\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
