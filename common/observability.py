"""Per-service Prometheus metrics and a health endpoint on one small HTTP server.

Each service owns a ``CollectorRegistry`` (so several services in one process — the demo —
do not collide) and serves ``/metrics`` (Prometheus text) and ``/healthz`` (JSON; 200 when
healthy, 503 otherwise) on a configurable port. Port 0 picks a free one; ``None`` disables.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)


class ServiceMetrics:
    """The counters every service has; services add their own on ``registry``."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        r = self.registry
        self.consumed = Counter("epu_messages_consumed_total", "Messages handled, by queue and outcome",
                                ["queue", "outcome"], registry=r)
        self.published = Counter("epu_messages_published_total", "Messages published, by type",
                                 ["type"], registry=r)
        self.dead_lettered = Counter("epu_messages_dead_lettered_total", "Messages sent to the dead-letter queue",
                                     ["queue"], registry=r)
        self.refused_senders = Counter("epu_messages_refused_sender_total",
                                       "Messages dead-lettered because their sender may not send them "
                                       "(key or broker user not the one allowed, common.senders)", ["queue"],
                                       registry=r)
        self.handler_seconds = Histogram("epu_handler_seconds", "Time spent in message handlers",
                                         ["queue"], registry=r)
        self.reconnects = Counter("epu_broker_reconnects_total", "Successful reconnections after a lost broker connection",
                                  registry=r)
        self.connection_losses = Counter("epu_broker_connection_losses_total", "Broker connections lost while serving",
                                         registry=r)
        self.connect_failures = Counter("epu_broker_connect_failures_total",
                                        "Attempts to connect that reached no broker URL", registry=r)
        self.reconnect_seconds = Gauge("epu_broker_last_reconnect_seconds",
                                       "From losing the broker connection to serving again, last time", registry=r)
        self.connected = Gauge("epu_broker_connected", "1 while connected to the broker", registry=r)
        self.broker_stalls = Counter("epu_broker_stalls_total",
                                     "Synchronous broker calls left unanswered past call_timeout on an open "
                                     "connection (the connection was broken and replaced): a stalled broker",
                                     registry=r)
        self.consumer_up = Gauge("epu_consumer_up", "1 while this service consumes the queue", ["queue"], registry=r)
        self.handler_retries = Counter("epu_handler_retries_total",
                                       "Handler failures retried in place, by queue and kind (transient: "
                                       "infrastructure, retried until it succeeds; error: bounded attempts; "
                                       "permanent: infrastructure no retry cures, the consumer or task stopped)",
                                       ["queue", "kind"], registry=r)
        self.timer_runs = Counter("epu_timer_runs_total", "Periodic task runs, by task and outcome",
                                  ["task", "outcome"], registry=r)
        for type_ in types_sent_by(service):  # from 0: see known_queue
            self.published.labels(type_)

    def known_queue(self, queue: str) -> None:
        """Export every counter series of a consumed ``queue`` at 0 now. Why: a labelled counter
        exists only from its first increment, and Prometheus's ``increase()`` reads a series
        born at 1 as no increase — ``EpuDeadLettersGrowing`` missed the first dead letters of a
        queue (issue 34). Known at 0, the first one is an increase of 1."""
        for outcome in CONSUME_OUTCOMES:
            self.consumed.labels(queue, outcome)
        self.dead_lettered.labels(queue)
        self.refused_senders.labels(queue)
        for kind in RETRY_KINDS:
            self.handler_retries.labels(queue, kind)

    def known_timer(self, task: str) -> None:
        """Export a periodic task's run counters at 0 (``known_queue`` says why)."""
        for outcome in ("ok", "error"):
            self.timer_runs.labels(task, outcome)


def types_sent_by(service: str) -> list[str]:
    """The message types the service ``service`` publishes (``common.senders.ALLOWED``)."""
    from epu.common.senders import ALLOWED

    role = f"epu-{service}"
    return sorted(t for t, roles in ALLOWED.items() if any(r.split("-{")[0] == role for r in roles))


CONSUME_OUTCOMES = ("ok", "dead-lettered", "requeued", "rejected")
"""The ``outcome`` label of ``epu_messages_consumed_total`` (the runtime's settlements)."""
RETRY_KINDS = ("transient", "error", "permanent")
"""The ``kind`` label of ``epu_handler_retries_total``."""


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up before its answer is written (a probe's timeout, a scraper
    restarting) is not an error of the service: no traceback on stderr for it."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        logging.getLogger("epu.health").warning("health endpoint request failed", exc_info=True,
                                                extra={"client": str(client_address[0])})


class HealthServer:
    """Serves /metrics and /healthz in a daemon thread."""

    def __init__(self, metrics: ServiceMetrics, health: Callable[[], dict[str, Any]],
                 host: str = "127.0.0.1", port: int = 0) -> None:
        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                if self.path.split("?")[0] == "/metrics":
                    body, status, ctype = generate_latest(registry), 200, CONTENT_TYPE_LATEST
                elif self.path.split("?")[0] in ("/healthz", "/health"):
                    doc = health()
                    body = json.dumps(doc).encode()
                    status, ctype = (200 if doc.get("healthy") else 503), "application/json"
                else:
                    body, status, ctype = b'{"error": "not found: try /metrics or /healthz"}', 404, "application/json"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        try:
            self.httpd = _QuietServer((host, port), Handler)
        except OSError as exc:  # say which port, and whose: "Address already in use" alone names neither
            raise OSError(exc.errno, f"{exc.strerror}: {host}:{port}, the metrics_port of the "
                                     f"{metrics.service} service") from None
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name=f"health-{metrics.service}",
                                        daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
