"""The scaler's HTTP side: Prometheus `/metrics` and the latest decisions as JSON.

`/decisions` (optionally `?workload=NAMESPACE/NAME`) is what `scaler explain` prints and what the
Karpenter companion reads: each workload's target, the term that set it with the numbers, its faults
and the signal it was made from. Served from a thread by the stdlib WSGI server, reading immutable
decision values, so it never blocks the gRPC event loop.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from gpu_queue_scaler.decision.policy import Decision

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def decision_json(decision: Decision) -> dict[str, Any]:
    return {
        "workload": decision.workload,
        "metric": decision.metric_name,
        "decision_id": decision.decision_id,
        "at": decision.at,
        "replicas": decision.replicas,
        "active": decision.active,
        "reason": decision.reason.value,
        "detail": decision.detail,
        "need": decision.need,
        "in_flight": decision.in_flight,
        "arrival_rate": decision.arrival_rate,
        "offered": decision.offered,
        "headroom": decision.headroom,
        "headroom_surge": decision.headroom_surge,
        "late_share": decision.late_share,
        "faults": list(decision.faults),
        "signal": decision.signal._asdict() if decision.signal is not None else None,
        "forecast": (decision.outlook._asdict() if decision.outlook is not None else None),
    }


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class HttpEndpoint:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        decisions: Callable[[], Iterable[Decision]],
    ) -> None:
        self._metrics = make_wsgi_app(registry)
        self._decisions = decisions
        self._server = make_server(
            host, port, self._app, server_class=_Server, handler_class=_QuietHandler
        )
        self.port: int = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterator[bytes]:
        if environ.get("PATH_INFO") != "/decisions":
            return iter(self._metrics(environ, start_response))
        wanted = parse_qs(environ.get("QUERY_STRING", "")).get("workload", [None])[0]
        found = [
            decision_json(d)
            for d in list(self._decisions())
            if wanted is None or d.workload == wanted
        ]
        body = json.dumps({"decisions": found}).encode()
        status = "200 OK" if found or wanted is None else "404 Not Found"
        start_response(status, [("Content-Type", "application/json")])
        return iter([body])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
