"""The layer contract `make lint` checks (pyproject.toml's ``[tool.importlinter]``): it holds on
this tree, it breaks on an import across it, and it names every package.

Each run is import-linter's own command on a link tree built in a temporary folder the way
``make venv`` builds ``.venv/hetero-src`` (tools/link_tree.py); the imports that break the
contract go into modules added there, in folders that are copies of links, so the working tree
is never written. The interpreter starts with ``-S``: the venv's ``.pth`` would put the real
link tree beside the temporary one in the ``hetero`` namespace package.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTRACT = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]


def _tools_link_tree() -> Any:
    spec = importlib.util.spec_from_file_location("link_tree", REPO / "tools" / "link_tree.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LINK_TREE = _tools_link_tree()


def _link_tree(prefix: Path) -> Path:
    """A fresh ``hetero-src`` link tree of this checkout under ``prefix``; returns its root."""
    site = prefix / "site"
    site.mkdir()
    root: Path = LINK_TREE.build_link_tree(REPO, prefix, site)
    return root


def _add_module(root: Path, name: str, source: str) -> None:
    """Add module ``name`` (dotted) under the link tree ``root`` without writing through a link:
    each linked folder on the way becomes a real folder of links to what it held."""
    *packages, module = name.split(".")
    folder = root
    for part in packages:
        folder = folder / part
        if folder.is_symlink():
            target = folder.resolve()
            folder.unlink()
            folder.mkdir()
            for child in target.iterdir():
                if child.name != "__pycache__":
                    (folder / child.name).symlink_to(child, target_is_directory=child.is_dir())
    (folder / f"{module}.py").write_text(source)


def _lint_imports(root: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with this checkout's contract on the link tree at ``root``."""
    config = workdir / "contract.toml"
    config.write_text((REPO / "pyproject.toml").read_text())
    paths = [str(root), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "COLUMNS": "200"}
    command = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
    return subprocess.run(
        [sys.executable, "-S", "-c", command, "--config", str(config), "--no-cache"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _broken(output: str) -> list[str]:
    return sorted(re.findall(r"^(.*?) BROKEN$", output, re.MULTILINE))


def test_the_contract_holds_on_this_tree(tmp_path: Path) -> None:
    result = _lint_imports(_link_tree(tmp_path), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_imports_across_the_layers_break_it_and_are_named(tmp_path: Path) -> None:
    root = _link_tree(tmp_path)
    # the scheduler reaching up into the engine
    _add_module(root, "hetero.framework.scheduler.upward", "import hetero.framework.engine\n")
    # the core (the policy package) reaching up into the executors
    _add_module(root, "hetero.framework.policy.upward", "import hetero.framework.executors\n")
    # the product importing the bench
    _add_module(root, "hetero.framework.server.benched", "import hetero.framework.bench.serve\n")
    # one backend importing another
    _add_module(root, "hetero.backends.cuda.borrowed", "import hetero.backends.npu.detect\n")
    # a cycle between two modules of one package
    _add_module(root, "hetero.cache.ping", "import hetero.cache.pong\n")
    _add_module(root, "hetero.cache.pong", "import hetero.cache.ping\n")
    # an import that never runs: left out of the graph, so no break
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import hetero.framework.cli\n"
    _add_module(root, "hetero.framework.graph_typing", typed)

    result = _lint_imports(root, tmp_path)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    names = [c["name"] for c in CONTRACT["contracts"]]
    assert _broken(out) == sorted(names)  # all three: layers, backends, acyclic
    assert "hetero.framework.scheduler is not allowed to import hetero.framework.engine" in out
    assert "hetero.framework.scheduler.upward -> hetero.framework.engine" in out
    assert "hetero.framework.policy is not allowed to import hetero.framework.executors" in out
    assert "hetero.framework.server is not allowed to import hetero.framework.bench" in out
    assert "hetero.backends.cuda is not allowed to import hetero.backends.npu" in out
    assert "No cycles are allowed in hetero.cache." in out
    assert "graph_typing" not in out


def _layer_names() -> set[str]:
    (layers,) = [c for c in CONTRACT["contracts"] if c["type"] == "layers"]
    names = set()
    for layer in layers["layers"]:
        for name in re.split(r"[|:]", layer):
            names.add(name.strip().strip("()"))
    return names


@pytest.mark.parametrize("package", ["hetero", "hetero.framework"])
def test_every_package_and_framework_module_sits_in_a_layer(package: str) -> None:
    """A new package or framework module outside every layer would escape the contract."""
    if package == "hetero":
        folders = LINK_TREE.mapped_folders(REPO / "setup.py")
        children = {f"hetero.{folder.split('/')[0]}" for folder in folders} - {"hetero.framework"}
    else:
        framework = REPO / "framework"
        children = {
            f"hetero.framework.{path.stem}"
            for path in framework.iterdir()
            if (path.suffix == ".py" and path.name != "__init__.py")
            or (path / "__init__.py").is_file()
        }
    assert children - _layer_names() == set()
