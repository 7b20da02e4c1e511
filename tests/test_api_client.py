"""The command's own Prefect API client (flows/api_client.py): one TLS context for every client
of the process, verifying as Prefect's settings say (never less than Prefect would)."""

from __future__ import annotations

import ssl

import certifi
from prefect import get_client
from prefect.settings import (
    PREFECT_API_SSL_CERT_FILE,
    PREFECT_API_TLS_INSECURE_SKIP_VERIFY,
    PREFECT_API_URL,
    temporary_settings,
)

from dprelease.flows.api_client import api_client


def _context(client) -> ssl.SSLContext:
    return client._client._transport._pool._ssl_context


def test_every_client_shares_one_context_that_trusts_what_prefect_s_own_client_trusts():
    with temporary_settings({PREFECT_API_URL: "https://prefect.example.org/api"}):
        with api_client() as first, api_client() as second, get_client(sync_client=True) as prefects:
            context, theirs = _context(first), _context(prefects)
            assert context is _context(second) and context is not theirs
    assert context.verify_mode == theirs.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.get_ca_certs(binary_form=True) == theirs.get_ca_certs(binary_form=True)
    assert context.cert_store_stats()["x509_ca"] >= len(ssl.create_default_context(cafile=certifi.where()).get_ca_certs()) > 0


def test_the_context_follows_prefect_s_own_tls_settings(tmp_path):
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(ssl.DER_cert_to_PEM_cert(_any_ca_certificate()))
    with temporary_settings({PREFECT_API_URL: "https://prefect.example.org/api", PREFECT_API_SSL_CERT_FILE: str(ca_file)}):
        with api_client() as client:
            own_ca = _context(client)
    assert own_ca.verify_mode == ssl.CERT_REQUIRED and own_ca.cert_store_stats()["x509_ca"] == 1
    with temporary_settings({PREFECT_API_URL: "https://prefect.example.org/api", PREFECT_API_TLS_INSECURE_SKIP_VERIFY: True}):
        with api_client() as client:
            insecure = _context(client)
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname


def _any_ca_certificate() -> bytes:
    context = ssl.create_default_context(cafile=certifi.where())
    return context.get_ca_certs(binary_form=True)[0]
