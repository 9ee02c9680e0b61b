"""/metrics (Prometheus text format) and /healthz (200, or 503 with the reason) over HTTP.

Binds to localhost by default. Serves nothing else: no command lines, no environment."""

from __future__ import annotations

import ipaddress
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tensorlights.daemon.health import Health
from tensorlights.errors import ConfigError
from tensorlights.threads import daemon_thread

log = logging.getLogger("tensorlights.metrics")


def exposure_warning(address: tuple[str, int]) -> str | None:
    """What an operator should know when metrics are served beyond this host: job names (the
    job label) are readable by anyone who can reach the address."""
    host = address[0]
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False  # a host name: it may resolve to anything
    if local:
        return None
    return (
        f"metrics are served on {host}:{address[1]}, beyond this host: anyone who can reach it "
        "reads the job names; use a loopback address and a scraping proxy, or a firewall"
    )


class MetricsServer:
    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, health: Health):
        registry_, health_ = registry, health

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, CONTENT_TYPE_LATEST, generate_latest(registry_))
                elif path == "/healthz":
                    ok, reason = health_.check()
                    self._reply(200 if ok else 503, "text/plain", (reason + "\n").encode())
                else:
                    self._reply(404, "text/plain", b"not found: try /metrics or /healthz\n")

            def _reply(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes every few seconds would flood the journal

        if warning := exposure_warning(address):
            log.warning("%s", warning)
        try:
            self._server = ThreadingHTTPServer(address, Handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {address[0]}:{address[1]}: {exc.strerror}"
            ) from exc
        self._server.daemon_threads = True
        self._thread = daemon_thread(self._server.serve_forever, "metrics-http")

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever: never if not started
            self._server.shutdown()
        self._server.server_close()
