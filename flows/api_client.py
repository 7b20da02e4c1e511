"""The Prefect API client for this process's own calls outside a flow run (waiting for a pause,
answering it, creating and watching a command's run): one TLS context for all of them.

Prefect builds a new TLS context for every client it makes, parsing the CA bundle again: 20-70 ms
each, nine times in a release answered at the command line, most of them while the command waits.
Handing Prefect a context skips that; the verification is the one Prefect would have set up from
its own settings (PREFECT_API_TLS_INSECURE_SKIP_VERIFY, PREFECT_API_SSL_CERT_FILE, else certifi's
bundle). Code inside a flow run keeps calling `prefect.get_client()` plainly: with no settings of its
own it gets the run's client, which this would not.
"""

from __future__ import annotations

import functools
import ssl


def api_client():
    """A synchronous Prefect client (use it as a context manager) with the shared TLS context."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY

    context = _tls_context(bool(PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value()), PREFECT_API_SSL_CERT_FILE.value() or "")
    return get_client(httpx_settings={"verify": context}, sync_client=True)


@functools.lru_cache(maxsize=4)
def _tls_context(skip_verify: bool, cert_file: str) -> ssl.SSLContext:
    """What prefect.client.orchestration builds per client, built once per setting."""
    if skip_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    import certifi

    return ssl.create_default_context(cafile=cert_file or certifi.where())
