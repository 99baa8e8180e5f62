"""``hetero run`` and ``hetero serve`` as a user runs them: real subprocesses, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EMBED_ONLY = """version: 1
stages:
  text_embed:
    modality: text
    model_version: all-minilm-l6-v2@1
    variants:
      full: {flops_per_item: 5.6 GFLOPS, bytes_per_item: 100 MB, max_batch: 32}
routes:
  /v1/embeddings: text_embed
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: silver}}
sla_tiers: {silver: {deadline_ms: 2000}}
cache: {enabled: false}
"""


def hetero(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hetero.framework.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_run_sends_one_request_through_the_http_stack(tmp_path: Path) -> None:
    policy = tmp_path / "embed.yaml"
    policy.write_text(EMBED_ONLY)
    sentence = tmp_path / "sentence.txt"
    sentence.write_text("A man is eating food.")
    result = hetero("run", "/v1/embeddings", "--input", str(sentence), "--policy", str(policy))
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["status"] == 200
    assert len(answer["body"]["data"][0]["embedding"]) == 384


def test_user_mistakes_exit_2_with_one_clear_line(tmp_path: Path) -> None:
    missing = hetero("run", "/v1/embeddings", "--input", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and "nope.txt" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(EMBED_ONLY.replace("max_batch: 32", "max_batch: -1"))
    served = hetero("serve", "--policy", str(bad), "--port", "0")
    assert served.returncode == 2
    assert "bad.yaml:" in served.stderr and "max_batch" in served.stderr
    assert "Traceback" not in served.stderr


def test_a_busy_port_is_a_usage_error_before_anything_says_listening(tmp_path: Path) -> None:
    import socket

    policy = tmp_path / "embed.yaml"
    policy.write_text(EMBED_ONLY)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        served = hetero("serve", "--policy", str(policy), "--port", port)
    assert served.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in served.stderr
    assert "listening on" not in served.stderr and "Traceback" not in served.stderr
