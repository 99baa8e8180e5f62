"""How ``hetero serve`` listens: uvicorn's settings from the policy's ``server`` section (the
guarded HTTP/1.1 protocol, which proxies' forwarding headers are believed), and what to warn
about before it starts."""

from __future__ import annotations

import ipaddress
from typing import Any

import uvicorn

from hetero.framework.policy.schema import ServerConfig
from hetero.framework.server.protocol import guarded_http

__all__ = ["server_config", "startup_warnings"]


def server_config(app: Any, server: ServerConfig, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for ``app`` on ``host:port``.

    ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed only from the addresses in
    ``server.trusted_proxies``: by default from none (uvicorn's own default trusts loopback,
    which lets any local client pick its address per request and so escape the failed-key
    throttle and multiply its anonymous fair share)."""
    trusted = list(server.trusted_proxies)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        http=guarded_http(server.limits.header_timeout_s, server.limits.max_header_bytes),
        loop="auto",  # uvloop where it is installed (not on Windows)
        proxy_headers=bool(trusted),
        forwarded_allow_ips=trusted or None,
    )


def startup_warnings(server: ServerConfig, host: str) -> list[str]:
    """What an operator should know before serving on ``host`` with these settings."""
    warnings = []
    if not _loopback(host) and not server.allowed_hosts:
        warnings.append(
            f"listening on {host} with server.allowed_hosts empty: any Host header is served, so "
            "a web page can reach this server through DNS rebinding; list the names clients "
            "use in server.allowed_hosts"
        )
    return warnings


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
