"""Map each fixed top-level folder to ``hetero.<folder>``; everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

FOLDERS = (
    "framework",
    "backends/cuda",
    "backends/rocm",
    "backends/npu",
    "backends/sim",
    "cache",
    "sandbox",
    "policies",
    "models",
)

package_dir = {}
for folder in FOLDERS:
    root = "hetero." + folder.replace("/", ".")
    package_dir[root] = folder
    for sub in find_namespace_packages(where=folder, exclude=["*__pycache__*"]):
        package_dir[f"{root}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(packages=sorted(package_dir), package_dir=package_dir)
