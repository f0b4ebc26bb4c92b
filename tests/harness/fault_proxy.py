"""A loopback HTTP proxy in front of the test S3 server that misbehaves like S3 under load.

Request number ``n`` (counted from 1 over every request the proxy sees) is answered with
``503 SlowDown`` when ``n % slow_every == slow_at``, and its connection is dropped without
an answer when ``n % drop_every == drop_at``; every other request goes to the S3 server
unchanged. A retried request gets a new number, so it goes through. ``refuse`` answers
every request (or those whose path holds ``refuse_paths``) with that status instead: a
permanent failure.

    with FaultProxy(s3_endpoint, slow_every=9, drop_every=23) as proxy:
        ...  # point endpoint_url at proxy.url
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"}


class FaultProxy:
    def __init__(self, upstream: str, *, slow_every: int = 0, slow_at: int = 4, drop_every: int = 0,
                 drop_at: int = 11, refuse: int | None = None, refuse_paths: str = "") -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.slow_every, self.slow_at, self.drop_every, self.drop_at = slow_every, slow_at, drop_every, drop_at
        self.refuse, self.refuse_paths = refuse, refuse_paths
        self.requests = self.slowed = self.dropped = 0
        self.faulted: list[str] = []  # "503 GET /bucket/key" of each request answered badly or dropped
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _fate(self, method: str, path: str) -> str:
        fate = self._choose(path)
        if fate != "pass":
            with self._lock:
                self.faulted.append(f"{fate} {method} {path}")
        return fate

    def _choose(self, path: str) -> str:
        with self._lock:
            self.requests += 1
            n = self.requests
            if self.refuse is not None and self.refuse_paths in path:
                return "refuse"
            if self.drop_every and n % self.drop_every == self.drop_at:
                self.dropped += 1
                return "drop"
            if self.slow_every and n % self.slow_every == self.slow_at:
                self.slowed += 1
                return "slow"
        return "pass"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fate = proxy._fate(self.command, self.path)
                if fate == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fate == "slow":
                    self._answer(503, SLOW_DOWN)
                    return
                if fate == "refuse":
                    status = proxy.refuse or 403
                    self._answer(status, b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>")
                    return
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    self.send_response(response.status, response.reason)
                    for key, value in response.getheaders():
                        if key.lower() not in _HOP and not (key.lower() == "content-length" and self.command != "HEAD"):
                            self.send_header(key, value)
                    if self.command != "HEAD":
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    upstream.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

        return Handler
