"""Run inside the network-less namespace by test_offline_install.py, with the bundle venv's
interpreter: serve the default policy from the installed wheel and report, as one JSON line,
what /ready and two model routes answered, where hetero was imported from, and the controls
(the routing table, and a TCP connection to a listener outside the namespace).

    python offline_check.py VENV CONTROL_HOST CONTROL_PORT
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

WAIT_S = 900.0  # an upper bound for the server's next line (first model conversion included)


def _routes() -> list[str]:
    """/proc/net/route's entries (IPv4), the header dropped: empty without a network."""
    return Path("/proc/net/route").read_text().splitlines()[1:]


def _connect(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=10):
            return "connected"
    except OSError as error:
        return f"{type(error).__name__}: {error}"


def _until(lines: queue.Queue[str], pattern: str, seen: list[str]) -> re.Match[str]:
    while True:
        try:
            line = lines.get(timeout=WAIT_S)
        except queue.Empty:
            raise SystemExit(f"no line matching {pattern!r}; saw: {seen[-20:]}") from None
        seen.append(line.rstrip())
        match = re.search(pattern, line)
        if match is not None:
            return match


def main() -> None:
    venv, host, port = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    report: dict[str, object] = {"routes": _routes(), "control": _connect(host, port)}
    report["hetero_from"] = subprocess.run(
        [str(venv / "bin/python"), "-c", "import hetero.framework as f; print(f.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    started = time.perf_counter()
    server = subprocess.Popen(
        [str(venv / "bin/hetero"), "serve", "--policy", "builtin:default", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "400", **_passed_env()},
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(
        target=lambda: [lines.put(line) for line in iter(server.stderr.readline, "")],  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    seen: list[str] = []
    try:
        url = _until(lines, r"listening on (http://\S+?:\d+)", seen).group(1)
        _until(lines, r"ready", seen)
        report["ready_after_s"] = round(time.perf_counter() - started, 1)
        with httpx.Client(base_url=url, timeout=120) as client:
            report["ready"] = client.get("/ready").status_code
            embed = client.post(
                "/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "offline"}
            )
            report["embeddings"] = embed.status_code
            if embed.status_code == 200:
                report["embedding_width"] = len(embed.json()["data"][0]["embedding"])
            else:
                report["embeddings_body"] = embed.text
            chat = client.post(
                "/v1/chat/completions",
                json={"model": "smollm2-135m-instruct", "max_tokens": 4,
                      "messages": [{"role": "user", "content": "Hi"}]},
            )  # fmt: skip
            report["chat"] = chat.status_code
            if chat.status_code != 200:
                report["chat_body"] = chat.text
    finally:
        server.terminate()
        server.wait(timeout=60)
    report["server_lines"] = seen[-5:]
    print(json.dumps(report))


def _passed_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in {"HOME", "HETERO_MODEL_CACHE"}}


if __name__ == "__main__":
    main()
