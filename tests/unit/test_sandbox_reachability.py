"""What a partition's uid must reach before a sandbox starts: the directories bound in, and
for runc the path down to the root filesystem (sandbox/reachability.py). Each case has a
control where the same layout, made searchable, passes."""

from __future__ import annotations

from pathlib import Path

from hetero.sandbox.oci_spec import Mount
from hetero.sandbox.reachability import first_unsearchable, reach_problems
from hetero.sandbox.runtimes import BwrapRuntime, GvisorRuntime, RuncRuntime


def test_a_bound_directory_others_cannot_enter_is_named_with_its_fix(reachable: Path) -> None:
    bound = reachable / "venv"
    bound.mkdir(mode=0o700)
    rootfs = reachable / "rootfs"
    mounts = [Mount(bound, str(bound))]
    for runtime in (RuncRuntime(reachable / "state"), GvisorRuntime(reachable / "state")):
        (problem,) = reach_problems(runtime, rootfs, mounts)
        assert f"{bound} is bound into the sandbox but its mode 0700" in problem, problem
        assert problem.endswith(f"chmod o+x {bound}")
    bwrap = BwrapRuntime(reachable / "state")  # runs as its caller
    assert reach_problems(bwrap, rootfs, mounts) == []
    bound.chmod(0o711)
    assert reach_problems(RuncRuntime(reachable / "state"), rootfs, mounts) == []


def test_a_root_filesystem_below_a_private_directory_stops_runc_not_gvisor(reachable: Path) -> None:
    private = reachable / "home"
    private.mkdir(mode=0o700)
    rootfs = private / "state" / "workers"  # not created yet: the walk ends at home
    (problem,) = reach_problems(RuncRuntime(reachable / "state"), rootfs, [])
    assert f"cannot pass {private} (mode 0700)" in problem and "sandbox.state_dir" in problem
    assert reach_problems(GvisorRuntime(reachable / "state"), rootfs, []) == []
    private.chmod(0o711)
    assert reach_problems(RuncRuntime(reachable / "state"), rootfs, []) == []


def test_the_walk_stops_at_the_first_directory_not_created_yet(reachable: Path) -> None:
    assert first_unsearchable(reachable / "a" / "b") is None
    (reachable / "a").mkdir(mode=0o700)
    assert first_unsearchable(reachable / "a" / "b") == reachable / "a"
    assert first_unsearchable(reachable) is None
