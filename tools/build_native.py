"""Compile the feature cache's hot modules with mypyc into the venv (``make venv`` runs this).

The modules are those :mod:`hetero.cache.compiled` names, taken from where this interpreter
imports ``hetero.cache`` (the venv's link tree, or a worktree's tree on PYTHONPATH). The build
goes to ``<venv>/hetero-compiled/<key>/hetero/cache/``, ``<key>`` being the hash of the sources it
is made from; ``hetero.cache`` uses it only while its sources still hash to that key, so an edited
source is never shadowed by its old build. Nothing to do, and no output, when the build of the
sources as they are exists already; otherwise mypyc and the C compiler take about 20-30 s. The
newest ``KEEP`` builds are kept (a venv shared by several worktrees); older ones go. Without a C
compiler or the Python headers, or if the build fails, it says so and exits 0: everything works
interpreted, and ``tests/unit/test_compiled_cache.py`` fails until a build exists.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
KEEP = 4
SCRATCH = ".building-"  # a build's scratch folder, beside the builds
SCRATCH_MAX_AGE_S = 3600.0
NOT_BUILT = "NOT-BUILT"  # beside the builds: why the last make venv left the modules interpreted


def load_compiled(package: Path) -> ModuleType:
    """hetero.cache.compiled, loaded by its path: importing hetero.cache would import the
    modules this is about to build."""
    spec = importlib.util.spec_from_file_location("_hetero_cache_compiled", package / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(package: Path, compiled: ModuleType, builds: Path) -> Path:
    """Copy the sources into a scratch folder beside the builds, compile the copy (mypyc, then
    the C compiler) and rename the result into place under the copy's key, once complete: a
    build that fails or is interrupted is never found, and a source edited while it runs cannot
    end up under a key whose sources it does not hold. Returns the build's folder."""
    from mypyc.build import mypycify
    from setuptools import setup

    builds.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=SCRATCH, dir=builds) as scratch:
        work = Path(scratch)
        tree = work / "src"  # holds hetero/: mypy names the modules from their paths under it
        copied = tree / "hetero" / "cache"
        for source in compiled.sources(package):
            relative = source.relative_to(package.parent)
            (tree / "hetero" / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, tree / "hetero" / relative)
        target = compiled.build_folder(copied)
        modules = [f"hetero/cache/{name}.py" for name in compiled.COMPILED]
        here = Path.cwd()
        os.chdir(tree)
        try:
            extensions = mypycify(
                [
                    "--config-file",
                    str(REPO / "pyproject.toml"),
                    "--explicit-package-bases",
                    "--cache-dir",
                    str(builds / ".mypy_cache"),
                    *modules,
                    # The types they import, from the copies the key hashed.
                    *(f"hetero/{path}" for path in compiled.IMPORTED),
                ],
                only_compile_paths=modules,
                target_dir=str(work / "c"),
                group_name=compiled.GROUP,
                opt_level="3",
            )
            setup(
                name="hetero-native",
                ext_modules=extensions,
                script_args=[
                    "--quiet",
                    "build_ext",
                    "--build-lib",
                    str(work / "lib"),
                    "--build-temp",
                    str(work / "tmp"),
                ],
            )
        finally:
            os.chdir(here)
        (work / "lib" / "SOURCES").write_text(
            "".join(f"{path}\n" for path in compiled.sources(package))
        )
        try:
            (work / "lib").rename(target)
        except OSError:  # another build of the same sources got there first
            if not target.is_dir():
                raise
    return target


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile (another worktree's prune sharing the venv)
        return None


def prune(builds: Path, keep: Path) -> None:
    """Keep the newest ``KEEP`` builds (``keep`` among them); scratch folders of builds that
    were killed go once they are an hour old (a build takes well under a minute)."""
    found: list[tuple[float, Path]] = []
    for path in builds.iterdir():
        mtime = _mtime(path)
        if mtime is None or not path.is_dir():
            continue
        if path.name.startswith(SCRATCH):
            if mtime < time.time() - SCRATCH_MAX_AGE_S:
                shutil.rmtree(path, ignore_errors=True)
        elif not path.name.startswith("."):
            found.append((mtime, path))
    found.sort(reverse=True)
    for _, old in found[KEEP:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def not_built(builds: Path, why: str) -> None:
    """Leave why there is no build where the tests that need one say it (:data:`NOT_BUILT`)."""
    builds.mkdir(parents=True, exist_ok=True)
    (builds / NOT_BUILT).write_text(why + "\n")


def missing_toolchain() -> str | None:
    """What the build needs and does not find: a C compiler, the Python headers."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"no Python headers ({headers})"
    return None


def main() -> int:
    started = time.monotonic()
    if sys.prefix == sys.base_prefix:
        print("build_native.py: run it with the venv's python, not the system's", file=sys.stderr)
        return 2
    spec = importlib.util.find_spec("hetero.cache")  # finds the folder, runs nothing of it
    if spec is None or not spec.submodule_search_locations:
        print("build_native.py: hetero.cache is not importable (make venv)", file=sys.stderr)
        return 2
    package = Path(next(iter(spec.submodule_search_locations)))
    compiled = load_compiled(package)
    target = compiled.build_folder(package)
    if compiled.compiled_folder(str(package)) is not None:  # complete, as the import sees it
        os.utime(target)  # in use: the newest, for prune
        return 0
    if target.is_dir():  # incomplete (a prune cut short, another Python's build): build anew
        shutil.rmtree(target, ignore_errors=True)
    missing = missing_toolchain()
    if missing:  # serving works without the build: say so, and go on interpreted
        why = f"{missing}: apt-get install gcc libc6-dev python3-dev, then make venv"
        print(f"build_native.py: WARNING: {why}; hetero.cache's hot modules stay interpreted "
              "(slower)", file=sys.stderr)  # fmt: skip
        not_built(target.parent, why)
        return 0
    print(f"build_native.py: compiling hetero.cache's {', '.join(compiled.COMPILED)} (mypyc)")
    try:
        target = build(package, compiled, target.parent)
    except (Exception, SystemExit) as err:  # mypyc exits on a type error: reported above
        # Not fatal: the sources run interpreted; `make typecheck` reports a type error, and
        # the test that the venv imports the build fails until a build succeeds.
        print(
            f"build_native.py: WARNING: the build failed ({err!r}): hetero.cache's hot modules "
            "stay interpreted",
            file=sys.stderr,
        )
        not_built(target.parent, f"the last build failed ({err!r}); make venv printed why")
        return 0
    (target.parent / NOT_BUILT).unlink(missing_ok=True)
    prune(target.parent, target)
    print(f"build_native.py: {target} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
