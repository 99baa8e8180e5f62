"""One real server whose LLM stage is pinned to vLLM (``server.runtimes``), for the tests that
need vLLM itself. They run in .venv-vllm (``make test-vllm``), never in .venv, which has no
vLLM: the default ``pytest`` leaves this folder out (``norecursedirs``) instead of skipping it.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from hetero.framework.graph import GraphFormat
from hetero.framework.policy import builtin_policy_text, load_policy_text
from hetero.framework.server import Serving, create_app

VLLM_DEVICE = "vllm:cpu"
LLM_KEY = "llm_generate/full"


def pytest_configure(config: pytest.Config) -> None:
    """Local files only (a hub download would fail the run), and vLLM's IPC sockets in a
    folder of the run's own instead of /tmp."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if "VLLM_RPC_BASE_PATH" not in os.environ:
        sockets = Path(config.rootpath) / ".venv-vllm" / "rpc"
        sockets.mkdir(parents=True, exist_ok=True)
        os.environ["VLLM_RPC_BASE_PATH"] = str(sockets)


def vllm_policy_text() -> str:
    """The default policy with the LLM stage pinned to the vLLM runtime."""
    text = builtin_policy_text("default")
    return text + "\nserver:\n  runtimes: {llm_generate: vllm}\n  limits: {max_output_tokens: 64}\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VllmServer:
    """The app on uvicorn in a thread, and the :class:`Serving` behind it."""

    def __init__(self, runtime: Serving) -> None:
        self.runtime = runtime
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            create_app(runtime), host="127.0.0.1", port=port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.started = threading.Event()
        original = self.server.startup

        async def startup(*args: Any, **kwargs: Any) -> None:
            await original(*args, **kwargs)
            self.started.set()

        self.server.startup = startup  # type: ignore[method-assign]

    def text_engine(self) -> Any:
        """The vLLM engine the LLM stage is resident in (its step statistics)."""
        engine = self.runtime.engine
        assert engine is not None
        threads = engine._threads.get(LLM_KEY.split("/", 1)[0], 0)  # the copy the lane ran
        models = engine.models[VLLM_DEVICE]
        runner, loaded_now = models.get(LLM_KEY, GraphFormat.VLLM, dict, threads)
        assert not loaded_now, "the LLM stage was not resident on vLLM"
        return runner.native("decoder")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    policy = load_policy_text(vllm_policy_text(), "default-on-vllm")
    runtime = Serving(
        policy,
        cache_directory=tmp_path_factory.mktemp("cache"),
        probe_runtimes=False,
        require_all_stages=True,  # the LLM stage failing on vLLM must fail the run
    )
    runtime.start()
    server = VllmServer(runtime)
    server.thread.start()
    assert server.started.wait(60), "uvicorn did not start"
    try:
        yield server
    finally:
        server.server.should_exit = True
        server.thread.join(30)
        runtime.close()
