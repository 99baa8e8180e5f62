"""The ``hetero`` command line.

Exit codes: 0 success, 2 a user error (bad policy, bad arguments, unknown backend), 1 an
internal error. No traceback for a user error unless ``--debug``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from rich.console import Console
from rich.logging import RichHandler

from hetero.framework import envs
from hetero.framework.cli.attest import add_attest_parser, run_attest
from hetero.framework.cli.audit import run_audit_verify
from hetero.framework.cli.bundle import add_bundle_parser, run_bundle
from hetero.framework.cli.commands import run_devices, run_plan, run_policy_devices
from hetero.framework.cli.deploy import add_deploy_parser, run_deploy
from hetero.framework.cli.sandbox import run_sandbox_check, run_sandbox_erase, run_sandbox_expire
from hetero.framework.cli.serve import add_server_parsers, run_server_command
from hetero.framework.cli.simulate import run_simulate
from hetero.framework.errors import HeteroError, PolicyValidationError
from hetero.framework.registry import default_registry

__all__ = ["main"]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USER = 2


def _version() -> str:
    try:
        return version("hetero")
    except PackageNotFoundError:
        return "unknown"


def _add_tune(commands: Any) -> None:
    tune = commands.add_parser(
        "tune", help="search the policy's scheduling knobs on the simulator (no class worse)"
    )
    tune.add_argument("policy", help="policy file with simulated devices")
    tune.add_argument("--workload", required=True, help="workload YAML file")
    tune.add_argument("--out", help="where to write the tuned policy (default POLICY.tuned.yaml)")
    tune.add_argument("--trials", type=int, default=30, help="simulations to run (default 30)")
    tune.add_argument("--seed", type=int, default=0, help="sampler seed: same seed, same policy")
    tune.add_argument("--timeout", type=float, help="stop after this many seconds (not seeded)")
    tune.add_argument(
        "--search-s",
        type=float,
        help="trials simulate only this many seconds after the warm-up; the best few are then "
        "judged on the whole workload",
    )
    tune.add_argument(
        "--finalists", type=int, default=3, help="trials judged on the whole workload (default 3)"
    )
    tune.add_argument(
        "--jobs",
        type=_at_least_one,
        default=1,
        help="trials simulated at a time, each in its own process (default 1); the tuned policy "
        "depends on the seed, the trials and this",
    )


def _at_least_one(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse turns the ValueError into exit 2)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _add_bench(commands: Any) -> None:
    bench = commands.add_parser("bench", help="benchmarks (figures, not pass/fail)")
    bench.add_argument("target", choices=["scheduler", "cache", "serve"], help="what to measure")
    bench.add_argument("--json", action="store_true", help="machine-readable output")
    bench.add_argument(
        "--devices", type=int, default=64, help="scheduler: fleet size, a multiple of 8"
    )
    bench.add_argument(
        "--seconds", type=float, default=5.0, help="serve: measured seconds per point"
    )
    bench.add_argument(
        "--concurrency", default="1,8,32", help="serve: closed-loop clients per point, e.g. 1,8,32"
    )
    bench.add_argument(
        "--placement",
        action="store_true",
        help="serve: free placement against each single-runtime pinning and the hand-tuned "
        "assignment (instead of the stacks against FastAPI)",
    )
    bench.add_argument(
        "--load",
        choices=["two", "six"],
        default="two",
        help="serve --placement: two (the serve bench's embed and vision) or six (the default "
        "policy's six stages, one pipeline each)",
    )
    bench.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="serve: interleaved rounds per point, each point its median round",
    )
    bench.add_argument(
        "--runtimes",
        default="onnxruntime,openvino,torch",
        help="serve --placement: the runtimes to pin every stage to, one stack each",
    )


def _run_bench(out: Console, parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.target == "serve":
        from hetero.framework.bench.serve_report import parse_concurrency, run_bench_serve

        try:
            levels = parse_concurrency(args.concurrency)
        except ValueError as error:
            parser.error(str(error))
        if args.rounds < 1:
            parser.error(f"--rounds: a positive count, got {args.rounds}")
        if args.placement:
            from hetero.framework.bench.serve_report import run_bench_placement

            runtimes = tuple(r.strip() for r in args.runtimes.split(",") if r.strip())
            from hetero.framework.bench.serve_placement import RUNTIMES

            unknown = [r for r in runtimes if r not in RUNTIMES]
            if not runtimes or unknown:
                parser.error(
                    f"--runtimes: one or more of {', '.join(RUNTIMES)}, got {args.runtimes!r}"
                )
            return run_bench_placement(
                out, args.json, args.seconds, levels, runtimes, args.load, args.rounds
            )
        return run_bench_serve(out, args.json, args.seconds, levels, args.rounds)
    from hetero.framework.bench.report import run_bench_cache, run_bench_scheduler

    if args.target == "cache":
        return run_bench_cache(out, args.json)
    if args.devices < 8 or args.devices % 8:
        parser.error(f"--devices: hosts of 8 devices, got {args.devices}")
    return run_bench_scheduler(out, args.json, args.devices)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="hetero",
        description="Multimodal inference across heterogeneous accelerators.",
    )
    parser.add_argument("--version", action="version", version=f"hetero {_version()}")
    parser.add_argument("--debug", action="store_true", help="debug logs and full tracebacks")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    devices = commands.add_parser("devices", help="list devices of every backend")
    devices.add_argument("--json", action="store_true", help="machine-readable output")
    devices.add_argument(
        "--policy", help="show the devices this policy uses (its simulated fleet), with topology"
    )
    _add_bench(commands)
    simulate = commands.add_parser(
        "simulate", help="simulate placement policies side by side on a workload"
    )
    simulate.add_argument("policy", help="policy file with simulated devices (or builtin:<name>)")
    simulate.add_argument("--workload", required=True, help="workload YAML file")
    simulate.add_argument(
        "--policies",
        default="hetero,round_robin,least_connections",
        help="comma-separated: hetero, round_robin, least_connections, power_of_two, "
        "pinned_fastest, lru, predictive",
    )
    simulate.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="run the workload's seed and the N-1 after it, and report the spread (default 1)",
    )
    simulate.add_argument("--json", action="store_true", help="machine-readable output")
    simulate.add_argument("--plot", metavar="FILE.png", help="latency CDFs and a busy timeline")
    _add_tune(commands)
    audit = commands.add_parser("audit", help="audit log tools")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    audit_verify = audit_commands.add_parser("verify", help="check chain, hashes, signatures")
    audit_verify.add_argument("file", help="the audit log (JSON lines)")
    audit_verify.add_argument("--public-key", required=True, help="the signer's Ed25519 PEM")
    audit_verify.add_argument(
        "--policy", help="take the anchor and the checkpoint age allowed from this policy"
    )
    audit_verify.add_argument("--anchor", help="the anchor file the writer appends checkpoints to")
    audit_verify.add_argument(
        "--max-checkpoint-age",
        type=float,
        metavar="SECONDS",
        help="how old a checkpoint that is not final may be (default: the policy's, else 60)",
    )
    audit_verify.add_argument(
        "--allow-missing-checkpoint",
        action="store_true",
        help="accept a log without its checkpoint (its tail could have been cut)",
    )
    audit_verify.add_argument(
        "--allow-stale-checkpoint",
        action="store_true",
        help="accept a checkpoint the writer did not close and is too old (after a crash)",
    )
    keys = commands.add_parser("keys", help="API key tools")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    keys_hash = keys_commands.add_parser(
        "hash", help="the salted hash a policy stores for the API key read from stdin"
    )
    keys_hash.add_argument("--new", action="store_true", help="make a new key and print both")
    sandbox = commands.add_parser("sandbox", help="sandbox runtimes, erasure and retention")
    sandbox_commands = sandbox.add_subparsers(
        dest="sandbox_command", required=True, metavar="ACTION"
    )
    sandbox_check = sandbox_commands.add_parser(
        "check", help="runtimes found, the isolation each gives, and whether partitions fit"
    )
    sandbox_check.add_argument("--policy", default="builtin:gov-onprem", help="policy file")
    sandbox_check.add_argument("--json", action="store_true", help="machine-readable output")
    sandbox_erase = sandbox_commands.add_parser("erase", help="erase a data subject's objects")
    sandbox_erase.add_argument("--policy", required=True, help="policy file")
    sandbox_erase.add_argument("--partition", required=True, help="partition name")
    sandbox_erase.add_argument("--subject", required=True, help="the data subject's identifier")
    sandbox_expire = sandbox_commands.add_parser("expire", help="apply retention periods")
    sandbox_expire.add_argument("--policy", required=True, help="policy file")
    add_server_parsers(commands)
    add_bundle_parser(commands)
    add_deploy_parser(commands)
    add_attest_parser(commands)
    plan = commands.add_parser("plan", help="validate a policy and show placement costs")
    plan.add_argument("policy", help="policy file, or builtin:<name> (builtin:default)")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _configure_logging(debug: bool, console: Console) -> None:
    level = "DEBUG" if debug else envs.log_level()
    handler = RichHandler(console=console, show_path=debug, show_time=debug)
    logging.basicConfig(level=level, format="%(message)s", handlers=[handler], force=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    as_json = bool(getattr(args, "json", False))
    out = Console(soft_wrap=as_json, width=None if sys.stdout.isatty() else 140)
    err = Console(stderr=True, soft_wrap=True)
    try:
        _configure_logging(args.debug, err)
        registry = default_registry()
        served = run_server_command(args, out, err, registry)
        if served is not None:
            return served
        if args.command == "devices" and args.policy:
            return run_policy_devices(out, registry, args.policy, args.json)
        if args.command == "devices":
            return run_devices(out, registry, args.json)
        if args.command == "bench":
            return _run_bench(out, parser, args)
        if args.command == "audit":
            return run_audit_verify(
                out,
                err,
                args.file,
                args.public_key,
                policy=args.policy,
                anchor=args.anchor,
                max_checkpoint_age_s=args.max_checkpoint_age,
                allow_missing_checkpoint=args.allow_missing_checkpoint,
                allow_stale_checkpoint=args.allow_stale_checkpoint,
            )
        if args.command == "bundle":
            return run_bundle(out, err, args)
        if args.command == "deploy":
            return run_deploy(out, err, registry, args)
        if args.command == "attest":
            return run_attest(out, err, args)
        if args.command == "keys":
            from hetero.framework.cli.keys import run_keys_hash

            return run_keys_hash(out, args.new)
        if args.command == "sandbox":
            if args.sandbox_command == "check":
                return run_sandbox_check(out, args.policy, args.json)
            if args.sandbox_command == "erase":
                return run_sandbox_erase(out, args.policy, args.partition, args.subject)
            return run_sandbox_expire(out, args.policy)
        if args.command == "tune":
            from hetero.framework.cli.tune import run_tune

            return run_tune(
                out,
                err,
                registry,
                args.policy,
                args.workload,
                args.out,
                args.trials,
                args.seed,
                args.timeout,
                args.search_s,
                args.finalists,
                args.jobs,
            )
        if args.command == "simulate":
            names = [n.strip() for n in args.policies.split(",") if n.strip()]
            return run_simulate(
                out,
                err,
                registry,
                args.policy,
                args.workload,
                names,
                args.json,
                args.plot,
                args.seeds,
            )
        return run_plan(out, registry, args.policy, args.json)
    except HeteroError as error:
        if args.debug:
            err.print_exception()
        err.print(f"error: {error}", highlight=False, markup=False)
        if isinstance(error, PolicyValidationError):
            for line in error.more:
                err.print(f"error: {line}", highlight=False, markup=False)
        return EXIT_USER
    except envs.EnvError as error:
        if args.debug:
            err.print_exception()
        err.print(f"error: {error}", highlight=False, markup=False)
        return EXIT_USER
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        if args.debug:
            err.print_exception()
        err.print(
            f"internal error: {type(error).__name__}: {error} (run with --debug for the traceback)",
            highlight=False,
            markup=False,
        )
        return EXIT_INTERNAL


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
