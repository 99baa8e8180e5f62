"""Map each fixed top-level folder to ``hetero.<folder>``; everything else is in pyproject.toml.

With ``HETERO_METADATA_ONLY=1`` (``make venv`` sets it) the distribution carries no modules,
only its dependencies, the ``hetero`` script and the entry points: the venv then imports
``hetero.*`` from these folders in place, through tools/link_tree.py's directory links.
"""

import os

from setuptools import find_namespace_packages, setup

FOLDERS = (
    "framework",
    "backends/cuda",
    "backends/rocm",
    "backends/npu",
    "backends/sim",
    "backends/vllm",
    "cache",
    "sandbox",
    "policies",
    "models",
)

package_dir = {}
for folder in FOLDERS if os.environ.get("HETERO_METADATA_ONLY") != "1" else ():
    root = "hetero." + folder.replace("/", ".")
    package_dir[root] = folder
    for sub in find_namespace_packages(where=folder, exclude=["*__pycache__*"]):
        package_dir[f"{root}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(packages=sorted(package_dir), package_dir=package_dir)
