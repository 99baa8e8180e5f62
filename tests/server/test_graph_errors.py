"""A request graph whose later step cannot be built gets a clear 4xx and takes nothing down:
a chat with an image whose prompt, once the image's context is in it, is over the input limit.
The stages are the fake plugins (tests/server/fakes.py) on the real engine."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import ServerThread, default_with_peer_routes
from fakes import FAKE_STAGES

from hetero.framework.samples import text_page_png
from hetero.framework.server import Serving, create_app


@pytest.fixture(scope="module")
def tight_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    runtime = Serving(
        default_with_peer_routes("max_input_tokens: 25"),
        stage_models=FAKE_STAGES,
        cache_directory=tmp_path_factory.mktemp("tight-cache"),
    )
    runtime.start()
    with ServerThread(create_app(runtime)) as server:
        yield server
    runtime.close()


def _chat(url: str, with_image: bool) -> httpx.Response:
    content: list[dict[str, Any]] = [{"type": "text", "text": "hi"}]
    if with_image:
        page = base64.b64encode(text_page_png(["HELLO"])).decode()
        content.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{page}"}})
    body = {
        "model": "smollm2-135m-instruct",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": content}],
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def test_a_prompt_over_the_limit_once_the_image_is_seen_is_a_400(
    tight_server: ServerThread,
) -> None:
    assert _chat(tight_server.url, with_image=False).status_code == 200  # under the limit
    refused = _chat(tight_server.url, with_image=True)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "over the limit of 25" in error["message"]
    again = _chat(tight_server.url, with_image=False)  # the engine and its lanes live on
    assert again.status_code == 200, again.text
