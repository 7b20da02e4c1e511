"""Serving the console: uvicorn on 127.0.0.1 by default (put it behind a reverse proxy with TLS to
reach it from elsewhere: docs/controller-guide.md), with the Prefect API the CLI uses."""

from __future__ import annotations

from dprelease.passkeys import RelyingParty
from dprelease.settings import Settings

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def relying_party(port: int, rp_id: str | None, origin: str | None) -> RelyingParty:
    """Where passkeys are used: by default the console on this machine (http://localhost:PORT, RP id
    localhost, a secure context for browsers); behind a proxy, its public https origin and domain."""
    from urllib.parse import urlsplit

    origin = (origin or f"http://localhost:{port}").rstrip("/")
    host = urlsplit(origin).hostname or ""
    rp_id = rp_id or host
    if not (origin.startswith("https://") or host == "localhost"):
        raise ValueError(f"passkeys need https (or http://localhost): the console's origin {origin} is neither; "
                         "put the console behind a TLS reverse proxy and give --origin https://YOUR.HOST")
    if host != rp_id and not host.endswith("." + rp_id):
        raise ValueError(f"the RP id {rp_id} must be the origin's host {host} or a domain it belongs to")
    return RelyingParty(rp_id=rp_id, origin=origin)


def serve(settings: Settings, host: str, port: int, rp: RelyingParty) -> None:
    """Run the console until interrupted (uvicorn handles SIGINT and SIGTERM)."""
    import uvicorn

    from .app import create_app

    uvicorn.run(create_app(settings, rp), host=host, port=port, log_level="warning", proxy_headers=True,
                forwarded_allow_ips="127.0.0.1")
