"""``hetero serve`` as an operator runs it: SIGHUP reloads the policy file (one line says what
changed), a broken file is refused with its line and the old policy keeps serving, and the
server still stops cleanly on SIGTERM. A real subprocess with the real embedding model."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
from test_cli_serving import EMBED_ONLY

WAIT_S = 240.0  # an upper bound for a line to appear, never a pacing delay


def _lines(stream: object, into: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        into.put(line)


def _until(lines: queue.Queue[str], pattern: str) -> re.Match[str]:
    seen = []
    while True:
        try:
            line = lines.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no line matching {pattern!r}; saw: {seen}") from None
        seen.append(line)
        match = re.search(pattern, line)
        if match is not None:
            return match


def _policy_name(url: str) -> str:
    return str(httpx.get(f"{url}/v1/devices", timeout=60).json()["policy"])


def test_sighup_reloads_and_refuses_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "embed.yaml"
    path.write_text("name: first\n" + EMBED_ONLY)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hetero.framework.cli",
            "serve",
            "--policy",
            str(path),
            "--port",
            "0",
            "--no-probe",  # timing the runtimes is not what this test is about
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "COLUMNS": "400"},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(server.stderr, lines), daemon=True).start()
    try:
        url = _until(lines, r"listening on (http://\S+?:\d+)").group(1)
        _until(lines, r"ready")
        assert _policy_name(url) == "first"

        path.write_text(
            "name: second\n" + EMBED_ONLY.replace("deadline_ms: 2000", "deadline_ms: 3000")
        )
        server.send_signal(signal.SIGHUP)
        line = _until(lines, r"policy reload")
        assert "policy reloaded: 'second'" in line.string, line.string
        assert "sla_tiers.silver.deadline_ms" in line.string
        assert _policy_name(url) == "second"
        answer = httpx.post(
            f"{url}/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "hi"}, timeout=60
        )
        assert answer.status_code == 200

        broken = ("name: third\n" + EMBED_ONLY).replace("deadline_ms: 2000", "deadline_ms: soon")
        path.write_text(broken)
        number = next(i for i, text in enumerate(broken.splitlines(), 1) if "soon" in text)
        server.send_signal(signal.SIGHUP)
        line = _until(lines, r"policy reload")
        assert "policy reload refused" in line.string and f"{path}:{number}" in line.string
        assert _policy_name(url) == "second"  # the old policy keeps serving
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=WAIT_S)
    assert code == 0
