"""One TLS context for the suite's httpx clients.

``httpx.get(...)`` / ``httpx.post(...)`` make a client per call, and each client builds an ``ssl.SSLContext`` and
loads the CA bundle into it: ~50 ms of CPU, even for the ``http://127.0.0.1`` URLs every test uses. The suite makes
such calls in its wait-for-ready loops and per request of many live tests (hundreds of call sites), so that was
minutes of CPU a run. The contexts httpx builds for the default ``verify`` (True, or False) are the same each time:
built once here and handed to every client. A client given its own context or certificate is left as it is.
"""

from __future__ import annotations

import functools


def share_default_tls_contexts() -> None:
    """Patch httpx's transport to reuse the context of each default ``verify`` (idempotent; no-op without httpx)."""
    try:
        from httpx._transports import default as transports
    except ImportError:
        return
    build = transports.create_ssl_context
    if getattr(build, "shared_tls", False):
        return

    cached = functools.cache(lambda verify, trust_env: build(verify=verify, trust_env=trust_env))

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if cert is None and isinstance(verify, bool):
            return cached(verify, trust_env)
        return build(verify=verify, cert=cert, trust_env=trust_env)

    create_ssl_context.shared_tls = True  # type: ignore[attr-defined]
    transports.create_ssl_context = create_ssl_context
