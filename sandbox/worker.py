"""The long-lived worker that runs *inside* a sandbox (``python -m hetero.sandbox.worker``).

It sees one partition at ``/data`` and a socket directory at ``/run/hetero``. For each request
it reads the named object's ciphertext from ``/data``, decrypts it with the data key the
orchestrator unwrapped for that object alone, runs its handler on the plaintext and answers with
the handler's result. Plaintext exists only in this process's memory; nothing is logged but
object ids and sizes.

The orchestrator holds one connection open for the worker's life (the ``lifeline`` op): when it
closes, however the orchestrator ended (``kill -KILL`` included, where no handler runs), the
worker exits, and with it the sandbox. A sandbox never outlives the server that started it.

Handlers: ``digest`` (SHA-256 and length of the plaintext: used to prove where decryption
happens) and ``stage:NAME`` (a registered model stage: OCR text for images, a transcript for
audio).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetero.sandbox.ciphers import DecryptionError
from hetero.sandbox.envelope import open_with_data_key
from hetero.sandbox.wire import WireError, receive, send

__all__ = ["main"]

Handler = Callable[[bytes, str], dict[str, Any]]


def _digest(plaintext: bytes, variant: str) -> dict[str, Any]:
    del variant
    return {"sha256": hashlib.sha256(plaintext).hexdigest(), "bytes": len(plaintext)}


def _stage_handler(stage_name: str) -> Handler:
    from hetero.framework.registry import default_registry

    registry = default_registry()
    registry.load_plugins()
    stages = registry.extensions("stage_model")
    if stage_name not in stages:
        raise SystemExit(f"no stage model {stage_name!r} (have: {', '.join(sorted(stages))})")
    model = stages[stage_name]()
    model.load()  # on the sandbox's own host device, through the npu backend

    def handle(data: bytes, variant: str) -> dict[str, Any]:
        (result,) = model.run(model.runner, variant, [data])
        if isinstance(result, BaseException):
            raise result
        if not isinstance(result, dict):
            raise SystemExit(f"stage {stage_name!r} takes no image or audio input")
        plain: dict[str, Any] = _plain(result)
        return plain

    return handle


def _plain(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def handler_named(name: str) -> Handler:
    """The handler called ``name``."""
    if name == "digest":
        return _digest
    if name.startswith("stage:"):
        return _stage_handler(name.removeprefix("stage:"))
    raise SystemExit(f"unknown handler {name!r}")


def _answer(
    request: dict[str, Any], data_dir: Path, partition: str, handle: Handler
) -> dict[str, Any]:
    op = request.get("op")
    if op == "ping":
        return {"ok": True, "pid": os.getpid()}
    if op != "process":
        return {"ok": False, "error": f"unknown op {op!r}"}
    object_id = str(request.get("object", ""))
    if not object_id or "/" in object_id or object_id.startswith("."):
        return {"ok": False, "error": f"bad object id {object_id!r}"}
    try:
        blob = (data_dir / object_id).read_bytes()
    except FileNotFoundError:
        return {"ok": False, "error": f"{partition}: no object {object_id!r} in this sandbox"}
    except OSError as err:
        return {"ok": False, "error": f"{partition}/{object_id}: cannot read: {err.strerror}"}
    try:
        key = base64.b64decode(str(request.get("data_key", "")), validate=True)
        plaintext = open_with_data_key(key, partition, object_id, blob)
    except (DecryptionError, ValueError) as err:  # binascii.Error is a ValueError
        return {"ok": False, "error": f"{partition}/{object_id}: {err}"}
    try:
        return {"ok": True, "result": handle(plaintext, str(request.get("variant", "full")))}
    except ValueError as err:  # the input itself is unusable (InvalidInputError is one)
        return {"ok": False, "kind": "invalid_input", "error": f"{object_id}: {err}"}
    except Exception as err:  # a model failing on one input must not end the worker
        return {"ok": False, "error": f"{object_id}: {type(err).__name__}: {err}"}


def _answer_safely(
    request: dict[str, Any], data_dir: Path, partition: str, handle: Handler
) -> dict[str, Any]:
    """:func:`_answer`, with anything unexpected answered as an error: one bad request never
    ends the worker (and with it every other caller's sandbox)."""
    try:
        return _answer(request, data_dir, partition, handle)
    except Exception as err:
        object_id = request.get("object", "")
        print(
            f"request for {object_id!r} failed: {type(err).__name__}", file=sys.stderr, flush=True
        )
        return {"ok": False, "error": f"{object_id}: {type(err).__name__}: {err}"}


def _watch_lifeline(connection: socket.socket, partition: str) -> None:
    """Block until the orchestrator's end of the lifeline closes, then end this process (the
    sandbox's init): nothing is left running for a server that is gone."""
    try:
        while connection.recv(64):
            pass
    except OSError:
        pass
    print(f"worker for {partition}: the orchestrator is gone, exiting", file=sys.stderr, flush=True)
    os._exit(0)


def serve(socket_path: Path, data_dir: Path, partition: str, handle: Handler) -> None:
    """Answer requests on ``socket_path`` one connection at a time, until the lifeline (if the
    orchestrator opened one) closes."""
    socket_path.unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(socket_path))
        listener.listen(8)
        print(f"worker for {partition} listening", file=sys.stderr, flush=True)
        while True:
            connection, _ = listener.accept()
            with connection:
                try:
                    request = receive(connection)
                    if request.get("op") == "lifeline":
                        send(connection, {"ok": True})
                        threading.Thread(
                            target=_watch_lifeline,
                            args=(connection.dup(), partition),
                            name="lifeline",
                            daemon=True,
                        ).start()
                        continue
                    send(connection, _answer_safely(request, data_dir, partition, handle))
                except (WireError, OSError) as err:
                    print(f"dropped a connection: {err}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point inside the sandbox."""
    parser = argparse.ArgumentParser(prog="hetero-sandbox-worker")
    parser.add_argument("--socket", type=Path, default=Path("/run/hetero/worker.sock"))
    parser.add_argument("--data", type=Path, default=Path("/data"))
    parser.add_argument("--partition", required=True)
    parser.add_argument("--handler", default="digest")
    args = parser.parse_args(argv)
    serve(args.socket, args.data, args.partition, handler_named(args.handler))


if __name__ == "__main__":
    main()
