"""The HTTP client for every outbound call: pod scrapes, the load generator, the companion's
reads of the scaler.

Two choices hold for all of them. No proxy from the environment (`trust_env=False`): pod IPs and
loopback are never reached through an HTTP proxy. And an idle pooled connection is reused for
`KEEPALIVE_S` at most: a server closes an idle keep-alive connection on its own timer (uvicorn,
which serves vLLM: 5 s; gunicorn: 2 s), and a request sent as it does is answered with a bare
close ("Server disconnected without sending a response"). For a scrape that is a failed read and
a fault reported for nothing; for the load generator, an error the server never made. Below every
common server's timer that race cannot happen, while calls closer together than it still reuse
their connection.
"""

from __future__ import annotations

from typing import Any

import httpx

KEEPALIVE_S = 1.0


def async_client(
    *,
    max_connections: int | None = 100,
    max_keepalive_connections: int | None = 20,
    **kwargs: Any,
) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` with the choices above (pool sizes: httpx's defaults unless
    given); other keyword arguments go to httpx as they are."""
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_keepalive_connections,
        keepalive_expiry=KEEPALIVE_S,
    )
    return httpx.AsyncClient(trust_env=False, limits=limits, **kwargs)
