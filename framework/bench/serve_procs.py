"""The processes ``hetero bench serve`` measures, and how it starts, sizes and stops them.

The child processes::

    python -m hetero.framework.bench.serve_procs fastapi --port P [--threads N]
    python -m hetero.framework.cli serve --policy F --port P

``fastapi`` is the baseline: a plain FastAPI app on uvicorn with ``def`` handlers (FastAPI's
thread pool, so model calls overlap), the same ``hetero.models`` stages each loaded by itself on
ONNX Runtime's CPU device, no engine, no batching, no queues, no cache. The other is the
``hetero`` command line itself, started by module name, never imported (the CLI imports the
bench, not the other way). Both run ONNX Runtime through the same executor, with intra-op
spin-waiting off.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "CLI_MODULE",
    "MODULE",
    "build_baseline_app",
    "environment",
    "free_port",
    "launch",
    "start",
    "stop",
    "tree_rss_mb",
    "wait_ready",
]

MODULE = "hetero.framework.bench.serve_procs"
CLI_MODULE = "hetero.framework.cli"


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
        return {"embedding": result.embedding.tolist(), "top1": result.top1}

    return app


def free_port() -> int:
    """A free TCP port on the loopback address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(module: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``python -m module`` with ``args``; output goes to ``log``."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def launch(
    module: str,
    args: list[str],
    log: Path,
    url: str,
    ready_path: str,
    timeout_s: float,
    warm: Callable[[str], None],
    label: str,
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start a server (:func:`start`), wait until it answers ``ready_path`` (an error carries
    its log's tail), exercise it with ``warm(url)``, and take its start-up seconds and idle
    RSS. A server that fails any of this is stopped before the error goes up."""
    began = time.perf_counter()
    process = start(module, args, log)
    try:
        try:
            wait_ready(url, ready_path, process, timeout_s)
        except RuntimeError as err:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{label}: {err}\n{tail}") from err
        startup_s = time.perf_counter() - began
        warm(url)
        time.sleep(0.5)  # let the warm-up's garbage go before idle memory is read
        figures: dict[str, Any] = {
            "startup_s": round(startup_s, 2),
            "idle_rss_mb": tree_rss_mb(process.pid),
        }
    except BaseException:
        stop(process)
        raise
    return process, figures


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


@contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for the block (the child processes inherit it)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def main(argv: list[str] | None = None) -> None:
    """Run the baseline's child process."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("stack", choices=["fastapi"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    _serve_baseline(args.port, args.threads)


if __name__ == "__main__":
    main()
