"""``hetero serve`` (the HTTP API on uvicorn) and ``hetero run`` (one request, in-process)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import mimetypes
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from hetero.framework.cli.startup import compliance_for, load_with_progress
from hetero.framework.errors import HeteroError
from hetero.framework.output import print_json
from hetero.framework.policy import load_policy
from hetero.framework.registry import Registry

__all__ = ["add_server_parsers", "run_run", "run_serve", "run_server_command"]

logger = logging.getLogger(__name__)
DEFAULT_POLICY = "builtin:default"


class UsageError(HeteroError, ValueError):
    """A wrong argument to a server command (exit 2)."""


def add_server_parsers(commands: Any) -> None:
    """Add ``serve``, ``run`` and ``demo`` to the CLI's sub-command parsers."""
    serve = commands.add_parser("serve", help="serve the HTTP API (OpenAI-compatible routes)")
    serve.add_argument("--policy", default=DEFAULT_POLICY, help="policy file or builtin:<name>")
    serve.add_argument("--host", default=None, help="address to bind (policy server.host)")
    serve.add_argument("--port", type=int, default=None, help="port (policy server.port)")
    serve.add_argument("--no-probe", action="store_true", help="skip timing each runtime")
    serve.add_argument(
        "--require-all-stages",
        action="store_true",
        help="exit (code 1) when any stage's model cannot load, instead of serving the others",
    )
    run = commands.add_parser("run", help="send one request in-process and print the result")
    run.add_argument("route", help="e.g. /v1/embeddings, /v1/image/describe, /v1/pipelines/chat")
    run.add_argument("--input", required=True, help="input file (text, image, audio or JSON)")
    run.add_argument("--policy", default=DEFAULT_POLICY, help="policy file or builtin:<name>")
    run.add_argument("--output", help="where to write binary output (speech WAV)")
    demo = commands.add_parser("demo", help="serve the default policy and send a mixed workload")
    demo.add_argument("--policy", default=DEFAULT_POLICY, help="policy file or builtin:<name>")


def run_server_command(
    args: argparse.Namespace, out: Console, err: Console, registry: Registry
) -> int | None:
    """Run ``serve``, ``run`` or ``demo`` if that is the command; None otherwise."""
    if args.command == "serve":
        return run_serve(
            out,
            err,
            registry,
            args.policy,
            args.host,
            args.port,
            probe=not args.no_probe,
            require_all_stages=args.require_all_stages,
        )
    if args.command == "run":
        return run_run(out, registry, args.route, args.input, args.policy, args.output)
    if args.command == "demo":
        from hetero.framework.cli.demo import run_demo

        return run_demo(out, err, registry, args.policy)
    return None


def run_serve(
    out: Console,
    err: Console,
    registry: Registry,
    policy_path: str,
    host: str | None,
    port: int | None,
    *,
    probe: bool = True,
    require_all_stages: bool = False,
) -> int:
    """Serve until interrupted; /ready answers 503 until every model that can load is loaded.

    A stage that cannot load is logged with its reason and not served; with
    ``require_all_stages`` it stops the server instead (exit code 1).
    """
    import uvicorn

    from hetero.framework.engine.heap import freeze_long_lived
    from hetero.framework.server import Serving, create_app
    from hetero.framework.server.listening import server_config, startup_warnings
    from hetero.framework.server.serving import StagesFailedError

    policy = load_policy(policy_path)
    gate, sandboxes = compliance_for(policy)
    runtime = Serving(
        policy,
        registry=registry,
        probe_runtimes=probe,
        gate=gate,
        sandboxes=sandboxes,
        require_all_stages=require_all_stages,
    )
    app = create_app(runtime, registry=registry)
    bind_host = host or policy.spec.server.host
    bind_port = policy.spec.server.port if port is None else port
    if not 0 <= bind_port <= 65535:
        raise UsageError(f"--port: {bind_port} is not a TCP port")
    listener = _bind(bind_host, bind_port)  # before "listening on": a busy port is exit 2
    server = uvicorn.Server(server_config(app, policy.spec.server, bind_host, bind_port))
    for warning in startup_warnings(policy.spec.server, bind_host):
        err.print(f"[yellow]warning[/]: {warning}", highlight=False)
    bind_port = listener.getsockname()[1]
    failure: list[BaseException] = []

    def load() -> None:
        try:
            load_with_progress(runtime, err)
            # What start-up made lives as long as the server: out of full collections
            # (framework/engine/heap.py), before the first request.
            freeze_long_lived()
            skipped = f", {len(runtime.failed)} not served" if runtime.failed else ""
            err.print(
                f"[green]ready[/]: http://{bind_host}:{bind_port} ({len(runtime.stages)} "
                f"stages{skipped}, policy {policy.spec.name!r})",
                highlight=False,
            )
        except BaseException as error:  # reported, then the server stops
            failure.append(error)
            server.should_exit = True

    err.print(
        f"hetero serve: policy {policy.spec.name!r}, listening on "
        f"http://{bind_host}:{bind_port} (/ready is 503 until the models are loaded)",
        highlight=False,
    )
    loader = threading.Thread(target=load, name="hetero-model-loader", daemon=True)
    loader.start()
    try:
        with _stopped_by_signals(), _reloaded_by_sighup(app.state.reloader, err):
            try:
                server.run(sockets=[listener])
            finally:
                runtime.close()  # stops every sandbox and closes the audit log
    finally:
        listener.close()
    if failure and isinstance(failure[0], StagesFailedError):
        err.print(f"error: {failure[0]} (--require-all-stages)", highlight=False, markup=False)
        return 1
    if failure:
        raise failure[0]
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; a clear usage error when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise UsageError(f"--host: cannot resolve {host!r}: {err.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGINT end ``hetero serve`` the same way: uvicorn drains the connections,
    then this process releases models and sandboxes and exits 0.

    uvicorn handles both while it runs and, once drained, raises the signal again for the
    handler it found; with Python's defaults SIGTERM would then kill the process before the
    sandboxes stop, and SIGINT would surface as KeyboardInterrupt. The handlers set here take
    that second delivery and do nothing, so the caller's clean-up runs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handled = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, _ignore_redelivery) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _reloaded_by_sighup(reloader: Any, err: Any) -> Iterator[None]:
    """SIGHUP reloads the policy file (as ``POST /admin/policy/reload`` does) on a thread of
    its own, never inside the signal handler, and prints one line saying what changed or why
    the file was refused (the old policy then keeps serving)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from hetero.framework.errors import PolicyError

    def reload() -> None:
        try:
            report = reloader.reload()
        except PolicyError as error:
            err.print(f"policy reload refused: {error}", highlight=False, markup=False)
            return
        changed = ", ".join(report.changed) or "nothing"
        swaps = "".join(
            f"; {r.stage}: {r.old.config.model_version} -> {r.new.config.model_version}"
            f" ({r.config.strategy})"
            for r in report.rollouts
        )
        err.print(
            f"policy reloaded: {report.policy!r} from {report.source} (changed: {changed}){swaps}",
            highlight=False,
            markup=False,
        )

    def on_sighup(signum: int, frame: object) -> None:
        threading.Thread(target=reload, name="hetero-policy-reload", daemon=True).start()

    previous = signal.signal(signal.SIGHUP, on_sighup)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def _ignore_redelivery(signum: int, frame: object) -> None:
    logger.info("signal %d: shutting down", signum)


def _request_for(route: str, data: bytes, path: Path, runtime: Any) -> dict[str, Any]:
    kind = (mimetypes.guess_type(path.name)[0] or "").split("/")[0]
    if path.suffix == ".json":
        return {"json": json.loads(data)}

    def model(stage_kind: str) -> str:
        return str(runtime.model_id(runtime.stage_of_kind(stage_kind)))

    text = data.decode("utf-8", errors="replace") if kind in ("text", "") else ""
    if route == "/v1/embeddings":
        return {"json": {"model": model("text_embed"), "input": text}}
    if route == "/v1/chat/completions":
        return {
            "json": {
                "model": model("llm_generate"),
                "messages": [{"role": "user", "content": text}],
            }
        }
    if route == "/v1/audio/speech":
        return {"json": {"model": model("tts"), "input": text, "response_format": "wav"}}
    if route == "/v1/audio/transcriptions":
        return {"files": {"file": (path.name, data)}, "data": {"model": model("asr")}}
    if route.startswith("/v1/pipelines/"):
        import base64

        field = "image" if kind == "image" else "audio" if kind == "audio" else "text"
        value = text if field == "text" else base64.b64encode(data).decode()
        return {"json": {"inputs": {field: value}}}
    return {"files": {"file": (path.name, data)}}


def run_run(
    out: Console,
    registry: Registry,
    route: str,
    input_path: str,
    policy_path: str,
    output: str | None,
) -> int:
    """One request through the full HTTP stack, in-process; prints the JSON answer."""
    from fastapi.testclient import TestClient

    from hetero.framework.server import Serving, create_app

    path = Path(input_path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UsageError(f"--input: cannot read {input_path}: {error.strerror}") from error
    if not route.startswith("/"):
        route = "/" + route
    policy = load_policy(policy_path)
    gate, sandboxes = compliance_for(policy)
    runtime = Serving(
        policy, registry=registry, probe_runtimes=False, gate=gate, sandboxes=sandboxes
    )
    runtime.start()
    try:
        with TestClient(create_app(runtime)) as client:
            response = client.post(route, **_request_for(route, data, path, runtime))
    finally:
        runtime.close()
    kind = response.headers.get("content-type", "")
    if kind.startswith("audio/"):
        target = Path(output or "speech.wav")
        target.write_bytes(response.content)
        print_json(
            out,
            {"status": response.status_code, "wrote": str(target), "bytes": len(response.content)},
        )
    elif kind.startswith("application/json"):
        print_json(out, {"status": response.status_code, "body": response.json()})
    else:
        print_json(out, {"status": response.status_code, "body": response.text})
    return 0 if response.status_code < 400 else 2
