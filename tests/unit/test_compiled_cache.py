"""The feature cache's compiled modules (mypyc): used after ``make venv``, never once stale, and
deciding exactly as the ``.py`` sources they are built from."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from hetero.cache import compiled
from hetero.framework.envs import compiled_modules
from hetero.framework.errors import CorruptEntryError

REPO = Path(__file__).resolve().parents[2]
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
SPEC = importlib.util.find_spec("hetero.cache")
assert SPEC is not None and SPEC.submodule_search_locations is not None
PACKAGE = Path(SPEC.submodule_search_locations[0])  # the sources (the spec never names the build)
NOT_BUILT = Path(sys.prefix) / compiled.BUILDS / "NOT-BUILT"  # tools/build_native.py's note
REBUILD = "no build of hetero.cache's sources as they are now: run `make venv`" + (
    f" (it said: {NOT_BUILT.read_text().strip()})" if NOT_BUILT.is_file() else ""
)


def imported_files(pythonpath: Path | None = None, **env: str) -> dict[str, str]:
    """Where a fresh interpreter imports each compiled module from."""
    names = [f"hetero.cache.{name}" for name in compiled.COMPILED]
    code = (
        "import importlib, json, sys\n"
        f"names = {names!r}\n"
        "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n"
    )
    environment = {**os.environ, "HETERO_COMPILED": "1", **env}
    if pythonpath is not None:
        environment["PYTHONPATH"] = str(pythonpath)
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True
    )
    files: dict[str, str] = json.loads(done.stdout)
    return {name.rsplit(".", 1)[1]: path for name, path in files.items()}


def require_build() -> Path:
    folder = compiled.build_folder(PACKAGE)
    if not folder.is_dir():
        pytest.fail(REBUILD)
    return folder


def test_the_venv_imports_the_compiled_modules() -> None:
    folder = require_build()
    for name, path in imported_files().items():
        assert path.endswith(SUFFIX), name
        assert path.startswith(str(folder)), name


def test_with_hetero_compiled_0_the_sources_are_imported() -> None:
    require_build()  # the control: without the switch the build would be used
    for name, path in imported_files(HETERO_COMPILED="0").items():
        assert Path(path) == PACKAGE / f"{name}.py"


def test_only_a_complete_build_of_these_sources_is_searched(tmp_path: Path) -> None:
    folder = compiled.build_folder(PACKAGE, prefix=str(tmp_path)) / "hetero" / "cache"
    folder.mkdir(parents=True)
    names = [*compiled.COMPILED, compiled.GROUP.rsplit(".", 1)[1] + "__mypyc"]
    for name in names[:-1]:  # the shared library missing: an incomplete build
        (folder / f"{name}{SUFFIX}").touch()
    assert compiled.compiled_folder(str(PACKAGE), prefix=str(tmp_path)) is None
    (folder / f"{names[-1]}{SUFFIX}").touch()
    assert compiled.compiled_folder(str(PACKAGE), prefix=str(tmp_path)) == str(folder)
    assert compiled.compiled_folder(str(PACKAGE), prefix=str(tmp_path), enabled=False) is None
    # Another key's build (the sources edited since) is not this one's.
    other = tmp_path / compiled.BUILDS / ("0" * 32)
    folder.parent.parent.rename(other)
    assert compiled.compiled_folder(str(PACKAGE), prefix=str(tmp_path)) is None


def checkout_copy(root: Path) -> Path:
    """A tree importing ``hetero.*`` like the venv's, with cache/ and framework/ copied (so they
    can be edited) and every other folder linked."""
    tree = root / "tree" / "hetero"
    tree.mkdir(parents=True)
    for source in PACKAGE.parent.iterdir():
        if source.name in ("cache", "framework"):
            shutil.copytree(
                source, tree / source.name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            (tree / source.name).symlink_to(source.resolve(), target_is_directory=True)
    return tree.parent


@pytest.mark.parametrize(
    "edited",
    ["cache/memory_tier.py", "cache/memory_queues.py", "cache/codec.py", "framework/errors.py"],
)
def test_an_edited_source_is_imported_never_its_old_build(tmp_path: Path, edited: str) -> None:
    require_build()
    tree = checkout_copy(tmp_path)
    # The control: the unedited copy has the build's key, so the build is used.
    assert all(path.endswith(SUFFIX) for path in imported_files(tree).values())
    with (tree / "hetero" / edited).open("a") as source:
        source.write("\nEDITED = True\n")
    files = imported_files(tree)
    for name, path in files.items():
        assert Path(path) == tree / "hetero" / "cache" / f"{name}.py", name


def test_the_key_covers_every_hetero_module_the_compiled_ones_import() -> None:
    imported: set[str] = set()
    for name in compiled.COMPILED:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    hetero = {module for module in imported if module.startswith("hetero.")}
    keyed = {f"hetero.cache.{name}" for name in compiled.COMPILED} | {
        "hetero." + path.removesuffix(".py").replace("/", ".") for path in compiled.IMPORTED
    }
    assert hetero <= keyed


# --- the compiled modules decide as the sources do ----------------------------------------


# The compiled modules the memory tier imports, each before those that import it.
IMPORTED_FIRST = ("window_steering", "frequency_sketch", "memory_queues")


def interpreted(name: str) -> ModuleType:
    """``hetero.cache.<name>`` run from its source, under another name, beside the compiled one
    (with the compiled modules the memory tier imports run from their sources too: its class
    extends memory_queues', and an interpreted class cannot extend a compiled one)."""
    saved = {each: sys.modules.get(f"hetero.cache.{each}") for each in IMPORTED_FIRST}
    module: ModuleType | None = None
    try:
        for each in (*IMPORTED_FIRST, name):
            spec = importlib.util.spec_from_file_location(
                f"_interpreted_{each}", PACKAGE / f"{each}.py"
            )
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if each in saved:  # what the next ones import
                sys.modules[f"hetero.cache.{each}"] = module
    finally:
        for each, before in saved.items():
            if before is not None:
                sys.modules[f"hetero.cache.{each}"] = before
            else:
                sys.modules.pop(f"hetero.cache.{each}", None)
    assert module is not None
    return module


def compiled_module(name: str) -> ModuleType:
    if not compiled_modules():
        pytest.skip("HETERO_COMPILED=0: this process runs the sources")
    module = importlib.import_module(f"hetero.cache.{name}")
    if not (module.__file__ or "").endswith(SUFFIX):
        pytest.fail(REBUILD)
    return module


def state(tier: Any) -> tuple[Any, ...]:
    queues = tuple(
        [(digest, entry[1:]) for digest, entry in queue.items()]
        for queue in (tier._window, tier._probation, tier._protected)
    )
    return (queues, tier.size_bytes, tier.window_max, tier.evictions, tier.rejections)


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_memory_tier_decides_exactly_as_its_source(seed: int) -> None:
    tiers_of = (compiled_module("memory_tier"), interpreted("memory_tier"))
    assert all(  # the interpreted tier is interpreted throughout: its base class too
        base.__module__.startswith("_interpreted_") for base in tiers_of[1].MemoryTier.__mro__[:-1]
    )
    rng = random.Random(seed)
    keys = [rng.randbytes(32) for _ in range(3000)]
    hot = keys[:300]
    budget = (2_000, 8_000, 30_000, 60_000)[seed]  # 0.7-20 % of the keys' bytes
    tiers = [module.MemoryTier(budget) for module in tiers_of]
    for step in range(40_000):
        key = rng.choice(hot) if rng.random() < 0.6 else rng.choice(keys)
        now = step / 1000
        action = rng.random()
        size = rng.randint(1, 200)
        expires = now + rng.choice([0.5, 5.0, 1e9])
        answers = []
        for tier in tiers:
            if action < 0.01:
                tier.delete(key)
            elif action < 0.0105:
                tier.clear()
            else:
                value = tier.get(key, now)
                stored = tier.put(key, step, size, expires) if value is None else None
                answers.append((value, stored))
        assert all(answer == answers[0] for answer in answers), step
        if step % 1000 == 0:
            assert state(tiers[0]) == state(tiers[1]), step
    assert state(tiers[0]) == state(tiers[1])
    assert tiers[0].evictions > 1000
    assert tiers[0].rejections > 100


def plain(value: Any) -> Any:
    """Arrays as (dtype, shape, items), for comparison."""
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tolist())
    if isinstance(value, dict):
        return {name: plain(each) for name, each in value.items()}
    return value


def test_the_compiled_codec_reads_and_writes_as_its_source() -> None:
    codecs = (compiled_module("codec"), interpreted("codec"))
    values: list[Any] = [
        np.arange(1280, dtype=np.float32),
        np.zeros((3, 4, 5), dtype=np.int16),
        {"boxes": np.ones((2, 4)), "scores": np.array([0.5, 0.25])},
        {"text": "ocr", "boxes": [[1, 2, 3, 4]]},
        [1, 2.5, None, "x"],
    ]
    for value in values:
        blob = codecs[0].encode(value)
        assert blob == codecs[1].encode(value)
        for codec in codecs:
            assert plain(codec.decode(blob)) == plain(value)
            assert plain(codec.decode(blob)) == plain(
                value
            )  # an array's layout kept the first time
        broken = bytearray(blob)
        broken[-1] ^= 1
        for codec in codecs:
            with pytest.raises(CorruptEntryError, match="checksum mismatch"):
                codec.decode(bytes(broken))
        record = b"\x01" * 27 + blob  # a lower tier's record: its header, then the value
        for codec in codecs:  # decoded in place, twice (the second on a known layout)
            assert plain(codec.decode_from(record, 27)) == plain(value)
            assert plain(codec.decode_from(record, 27)) == plain(value)
            with pytest.raises(CorruptEntryError, match="checksum mismatch"):
                codec.decode_from(b"\x01" * 27 + bytes(broken), 27)


def test_prune_keeps_the_newest_builds_and_clears_killed_builds_scratch(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "build_native", REPO / "tools" / "build_native.py"
    )
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    now = 1_000_000_000.0
    folders = {}
    for age, name in enumerate(["b0", "b1", "b2", "b3", "b4", "b5"]):  # b0 the newest
        folders[name] = tmp_path / name
        folders[name].mkdir()
        os.utime(folders[name], (now - age, now - age))
    stale, fresh = tmp_path / f"{tool.SCRATCH}killed", tmp_path / f"{tool.SCRATCH}running"
    stale.mkdir()
    fresh.mkdir()
    os.utime(stale, (0.0, 0.0))  # an hour old long ago: a build that was killed
    tool.prune(tmp_path, keep=folders["b5"])  # the build in use stays, however old
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == sorted([fresh.name, "b0", "b1", "b2", "b3", "b5"])
