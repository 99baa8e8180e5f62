"""The processes ``hetero bench serve`` measures, and how it starts, sizes and stops them.

Entry point for the child processes::

    python -m hetero.framework.server.bench_procs fastapi --port P [--threads N] [--spin]
    python -m hetero.framework.server.bench_procs hetero [--spin] -- serve --policy F --port P

``fastapi`` is the baseline: a plain FastAPI app on uvicorn with ``def`` handlers (FastAPI's
thread pool, so model calls overlap), the same ``hetero.models`` stages, no batching, no queues,
no cache. ``hetero`` is the ``hetero`` command line itself. Both turn ONNX Runtime's intra-op
spin-waiting off unless ``--spin``: every stack of one run gets the same setting.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "build_baseline_app",
    "disable_ort_spinning",
    "free_port",
    "start",
    "stop",
    "tree_rss_mb",
    "wait_ready",
]

MODULE = "hetero.framework.server.bench_procs"


def disable_ort_spinning() -> None:
    """Make every ONNX Runtime session of this process start with spin-waiting off.

    ``session.intra_op.allow_spinning=0`` lets idle intra-op threads sleep instead of burning
    the cores the HTTP loop and the other model need (the peers measured +20-60 % throughput on
    2 cores). hetero's sessions do not set it, so the bench sets it the same way everywhere.
    """
    import onnxruntime as ort

    original: Any = ort.InferenceSession
    if getattr(original, "hetero_no_spin", False):
        return

    class NoSpinSession(original):  # type: ignore[misc]
        hetero_no_spin = True

        def __init__(self, model: Any, sess_options: Any = None, *args: Any, **kw: Any) -> None:
            options = sess_options if sess_options is not None else ort.SessionOptions()
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
            super().__init__(model, options, *args, **kw)

    ort.InferenceSession = NoSpinSession


def build_baseline_app(threads: int) -> Any:
    """Plain FastAPI serving ``/embed`` and ``/vision`` with one model each, loaded now."""
    from fastapi import Body, FastAPI, HTTPException

    from hetero.models.embed import TextEmbedder
    from hetero.models.vision import VisionEncoder

    embedder = TextEmbedder(threads=threads)
    encoder = VisionEncoder(threads=threads)
    embedder.load()
    encoder.load()
    app = FastAPI(title="bench-fastapi")

    @app.post("/embed")
    def embed(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        texts = body.get("texts")
        if not isinstance(texts, list) or not texts:
            raise HTTPException(400, "texts: a non-empty list is required")
        return {"embeddings": embedder.embed(texts).tolist()}

    @app.post("/vision")
    def vision(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        try:
            image = base64.b64decode(body["image_b64"], validate=True)
            result = encoder.encode([image])[0]
        except Exception as err:
            raise HTTPException(400, f"image_b64: {err}") from err
        return {"embedding": result.embedding.tolist(), "top1": top1(encoder, result)}

    return app


def top1(encoder: Any, result: Any) -> int:
    """The ImageNet index of the most likely label (what the peers' API returns)."""
    index = getattr(encoder, "bench_label_index", None)
    if index is None:
        index = {name: i for i, name in enumerate(encoder._labels)}
        encoder.bench_label_index = index
    return int(index.get(result.labels[0][0], -1))


def free_port() -> int:
    """A free TCP port on the loopback address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``python -m`` this module with ``args``; output goes to ``log``."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", MODULE, *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_ready(url: str, path: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll ``GET url+path`` (or any answer at all for ``path=""``) until 200."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=5.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{url}: the server exited with code {process.returncode}")
            try:
                response = client.get(path or "/openapi.json")
                if response.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
    raise RuntimeError(f"{url}{path}: not ready after {timeout_s:.0f} s")


def tree_rss_mb(pid: int) -> float:
    """RSS of a process and all its descendants, in MB (what ``ps`` shows, summed)."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for process in (root, *root.children(recursive=True)):
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return round(total / 1e6, 1)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process (it was started as its own session leader), SIGKILL after 10 s."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def _serve_baseline(port: int, threads: int) -> None:
    import uvicorn

    app = build_baseline_app(threads)
    # uvicorn's defaults otherwise, as the peers ran it, but without the access log, as hetero
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def main(argv: list[str] | None = None) -> None:
    """Run one child process of the bench."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("stack", choices=["fastapi", "hetero"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--spin", action="store_true", help="leave ORT spin-waiting on")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    rest = argv[split + 1 :]  # hetero: its own command line
    if not args.spin:
        disable_ort_spinning()
    if args.stack == "fastapi":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        _serve_baseline(args.port, args.threads)
        return
    from hetero.framework.cli import main as hetero_main

    sys.exit(hetero_main(rest))


if __name__ == "__main__":
    main()
