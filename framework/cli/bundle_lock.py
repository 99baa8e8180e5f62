"""The exact dependency set an air-gapped bundle pins: what this venv resolved.

``hetero bundle`` ships the versions ``make venv`` installed, never a fresh resolution: the
bundle then installs what the tests ran against. The set is hetero's own requirements for the
chosen extras, followed through every installed distribution's ``Requires-Dist`` (markers
evaluated for this interpreter, extras carried along), each pinned to the version installed
here. The model packages ``make venv`` installs with ``--no-deps`` (their declared
dependencies are heavy or unbuildable) are pinned apart and never followed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from hetero.framework.errors import HeteroError

__all__ = ["BundleError", "Pin", "model_pins", "resolve_pins"]


class BundleError(HeteroError):
    """The bundle cannot be built as asked (a user error: exit code 2)."""


@dataclass(frozen=True, order=True)
class Pin:
    """One distribution at the version installed in this venv.

    Attributes:
        name: the canonical project name (``torch``, ``opentelemetry-sdk``).
        version: the installed version, local label included (``2.13.0+cpu``).
        required_by: who needs it (``hetero[models]``, ``transformers``), for error messages.
    """

    name: str
    version: str
    required_by: str = ""

    def requirement(self) -> str:
        """``name==version``, as pip reads it."""
        return f"{self.name}=={self.version}"


def _installed(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras))


def resolve_pins(
    root: str = "hetero", extras: Iterable[str] = (), exclude: Iterable[str] = ()
) -> tuple[Pin, ...]:
    """Every distribution ``root[extras]`` needs, pinned to its installed version.

    ``root`` itself is not in the answer (its wheel is built from source). ``exclude`` names
    are neither pinned nor followed (the ``--no-deps`` model packages).

    Raises:
        BundleError: ``root`` or an extra is unknown, or a requirement is not installed here
            (or installed at a version it does not accept), naming who requires it.
    """
    top = _installed(root)
    if top is None:
        raise BundleError(f"{root} is not installed in this venv ({sys.prefix})")
    wanted_extras = sorted(set(extras))
    unknown = sorted(set(wanted_extras) - set(top.metadata.get_all("Provides-Extra") or ()))
    if unknown:
        raise BundleError(f"{root} has no extra named {', '.join(unknown)}")
    skipped = {canonicalize_name(name) for name in exclude}
    pins: dict[str, Pin] = {}
    done: set[tuple[str, tuple[str, ...]]] = set()
    todo: list[tuple[metadata.Distribution, tuple[str, ...], str]] = [
        (top, tuple(wanted_extras), f"{root}[{','.join(wanted_extras)}]")
    ]
    while todo:
        dist, dist_extras, label = todo.pop()
        for line in dist.requires or ():
            try:
                requirement = Requirement(line)
            except InvalidRequirement as error:
                raise BundleError(f"{label}: unreadable requirement {line!r}: {error}") from error
            name = canonicalize_name(requirement.name)
            if not _applies(requirement, dist_extras) or name in skipped:
                continue
            found = _installed(name)
            if found is None:
                raise BundleError(
                    f"{requirement} (required by {label}) is not installed in this venv: "
                    "run `make venv` first"
                )
            if not requirement.specifier.contains(found.version, prereleases=True):
                raise BundleError(
                    f"{requirement} (required by {label}) is not met by the installed "
                    f"{name} {found.version}: run `make venv` first"
                )
            pins.setdefault(name, Pin(name, found.version, label))
            key = (name, tuple(sorted(requirement.extras)))
            if key not in done:
                done.add(key)
                todo.append((found, key[1], name))
    pins.pop(canonicalize_name(root), None)
    return tuple(sorted(pins.values()))


def model_pins(lines: Iterable[str], installed: Mapping[str, str] | None = None) -> tuple[Pin, ...]:
    """The ``--no-deps`` model packages (``name==version`` lines, ``#`` comments), checked
    against what this venv has installed.

    Raises:
        BundleError: a line is not ``name==version``, or that version is not installed here.
    """
    pins = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise BundleError(f"model packages, line {number}: expected name==version: {raw!r}")
        name = canonicalize_name(name.strip())
        version = version.strip()
        if installed is not None:
            have = installed.get(name)
        else:
            found = _installed(name)
            have = found.version if found is not None else None
        if have != version:
            state = "not installed" if have is None else f"installed at {have}"
            raise BundleError(
                f"model packages, line {number}: {name}=={version} is {state} in this venv: "
                "run `make venv` first"
            )
        pins.append(Pin(name, version, "model packages"))
    return tuple(sorted(pins))
