"""An S3 server for the tests: moto's server mode on a free port of this machine, spoken to
over HTTP by the s3fs client (the code path of AWS), and a proxy in front of it that injects
faults (error responses, dropped connections).

``S3Server.start()`` serves until ``stop()``; ``env`` holds what a process needs to reach it
(credentials, endpoint; ``SHARDWISE_STORAGE_BACKOFF`` short, so retries take milliseconds).
``FaultProxy(server)`` forwards to it, answering the requests a rule matches with an error
(``status=503, code='SlowDown'``), by closing the connection (``drop=True``), or by
forwarding the request and then closing the connection unanswered (``lose=True``: the store
did it, the client never hears), ``times`` times each.

Example::

    server = S3Server.start()
    url = server.bucket('ckpts')                 # 's3://ckpts', created
    proxy = FaultProxy(server).start()
    proxy.add(method='PUT', path='__1_0.distcp', status=503, code='SlowDown', times=2)
    env = proxy.env                              # the same server, through the proxy
"""

from __future__ import annotations

import http.client
import logging
import os
import random
import re
import socket
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.distributed import free_port

CREDENTIALS = dict(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_EC2_METADATA_DISABLED="true",
    AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    AWS_CONFIG_FILE=os.devnull,
)


class S3Server:
    """moto's S3 server (``moto[server]``) in a thread of this process, on ``port``."""

    def __init__(self, port: int) -> None:
        from moto.server import ThreadedMotoServer

        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)

    @classmethod
    def start(cls) -> S3Server:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        server = cls(free_port())
        server._server.start()
        return server

    def stop(self) -> None:
        self._server.stop()

    @property
    def env(self) -> dict[str, str]:
        """The environment of a process that uses this server."""
        return {
            **CREDENTIALS,
            "AWS_ENDPOINT_URL": self.endpoint,
            "SHARDWISE_STORAGE_BACKOFF": "0.02",
        }

    def bucket(self, name: str | None = None) -> str:
        """A new bucket (a fresh name by default): its URL."""
        import boto3

        name = name or f"b-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials()).create_bucket(
            Bucket=name
        )
        return f"s3://{name}"

    def client(self) -> Any:
        """A plain boto3 client of this server (to look at or damage objects directly)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials())


_SHARED: S3Server | None = None


def shared_server() -> S3Server:
    """One server for this whole test process, started on first use, with this process's
    environment pointing at it from then on (fsspec keeps one S3 client per set of options,
    bound to the endpoint it first saw: every test of the process uses the same server)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = S3Server.start()
        os.environ.update(_SHARED.env)
    return _SHARED


def _boto_credentials() -> dict[str, str]:
    return dict(
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
    )


@dataclass
class Rule:
    """Requests whose method is ``method`` (None: any) and whose path and query match the
    regular expression ``path`` get ``status`` with the S3 error ``code`` (or a closed
    connection with ``drop``, or the request forwarded and its response lost with ``lose``),
    ``times`` times (-1: always), each with probability ``rate`` (drawn from the proxy's
    seeded generator)."""

    method: str | None = None
    path: str = ""
    status: int = 503
    code: str = "SlowDown"
    drop: bool = False
    lose: bool = False
    times: int = 1
    rate: float = 1.0
    hits: int = 0
    seen: list[str] = field(default_factory=list)

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and re.search(self.path, path)


class FaultProxy:
    """An HTTP proxy in front of an :class:`S3Server` that injects faults (see the module
    docstring). ``requests`` counts what passed through."""

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self.port = free_port()
        self.rules: list[Rule] = []
        self.random = random.Random(0)
        self.requests = 0
        self.seen: list[str] = []  # every request's method and path, in order
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                body = self._body()
                rule = proxy._fault(self.command, self.path)
                if rule is not None and (rule.drop or rule.lose):
                    if rule.lose:
                        self._upstream(body)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if rule is not None:
                    message = (
                        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{rule.code}'
                        f"</Code><Message>injected by the test proxy</Message></Error>"
                    ).encode()
                    self.send_response(rule.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                self._forward(body)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _upstream(self, body: bytes) -> tuple[http.client.HTTPResponse, bytes]:
                """The request sent on to the server; its response and body."""
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.server.port, timeout=60)
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("transfer-encoding", "expect")
                }
                headers["Content-Length"] = str(len(body))
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                upstream.close()
                return response, data

            def _forward(self, body: bytes) -> None:
                response, data = self._upstream(body)
                self.send_response(response.status, response.reason)
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def add(self, **rule: Any) -> Rule:
        added = Rule(**rule)
        with self._lock:
            self.rules.append(added)
        return added

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _fault(self, method: str, path: str) -> Rule | None:
        with self._lock:
            self.requests += 1
            self.seen.append(f"{method} {path}")
            for rule in self.rules:
                if rule.times == 0 or not rule.matches(method, path):
                    continue
                if rule.rate >= 1 or self.random.random() < rule.rate:
                    rule.times -= 1 if rule.times > 0 else 0
                    rule.hits += 1
                    rule.seen.append(f"{method} {path}")
                    return rule
        return None

    @property
    def env(self) -> dict[str, str]:
        return {**self.server.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}"}
