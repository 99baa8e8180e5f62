"""What a partition's uid must reach before a sandbox starts: the directories bound in, and
for runc the path down to the root filesystem (sandbox/reachability.py). Each case has a
control where the same layout, made searchable, passes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetero.sandbox.oci_spec import Mount
from hetero.sandbox.reachability import first_unsearchable, reach_problems
from hetero.sandbox.runtimes import BwrapRuntime, GvisorRuntime, RuncRuntime


@pytest.fixture
def site() -> Iterator[Path]:
    """A directory others may search (pytest's own are private to their owner)."""
    directory = Path(tempfile.mkdtemp(prefix="hetero-reach-test-")).resolve()
    directory.chmod(0o711)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_bound_directory_others_cannot_enter_is_named_with_its_fix(site: Path) -> None:
    bound = site / "venv"
    bound.mkdir(mode=0o700)
    rootfs = site / "rootfs"
    mounts = [Mount(bound, str(bound))]
    for runtime in (RuncRuntime(site / "state"), GvisorRuntime(site / "state")):
        (problem,) = reach_problems(runtime, rootfs, mounts)
        assert f"{bound} is bound into the sandbox but its mode 0700" in problem, problem
        assert problem.endswith(f"chmod o+x {bound}")
    assert reach_problems(BwrapRuntime(site / "state"), rootfs, mounts) == []  # runs as its caller
    bound.chmod(0o711)
    assert reach_problems(RuncRuntime(site / "state"), rootfs, mounts) == []


def test_a_root_filesystem_below_a_private_directory_stops_runc_not_gvisor(site: Path) -> None:
    private = site / "home"
    private.mkdir(mode=0o700)
    rootfs = private / "state" / "workers"  # not created yet: the walk ends at home
    (problem,) = reach_problems(RuncRuntime(site / "state"), rootfs, [])
    assert f"cannot pass {private} (mode 0700)" in problem and "sandbox.state_dir" in problem
    assert reach_problems(GvisorRuntime(site / "state"), rootfs, []) == []
    private.chmod(0o711)
    assert reach_problems(RuncRuntime(site / "state"), rootfs, []) == []


def test_the_walk_stops_at_the_first_directory_not_created_yet(site: Path) -> None:
    assert first_unsearchable(site / "a" / "b") is None
    (site / "a").mkdir(mode=0o700)
    assert first_unsearchable(site / "a" / "b") == site / "a"
    assert first_unsearchable(site) is None
