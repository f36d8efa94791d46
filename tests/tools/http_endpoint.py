"""A real HTTP server on 127.0.0.1 for the tests of HTTP tools: it records every request and answers by path.

- `/echo/...`: 200, JSON of what it received (method, path, query, headers, body), Authorization included
- `/bearer/TOKEN`: 200 to `Authorization: Bearer TOKEN`, 401 to anything else
- `/text`: 200, text/plain
- `/bare`: 200, without a Content-Type
- `/fail`: 500, a text body that repeats the Authorization header
- `/busy`: 503
- `/slow`: answers only when the test ends (`release`), long after any tool's timeout
- `/drip`: 200, a few bytes every 50 ms without a Content-Length, until the test ends (`release`)
- `/stream/N`: 200, N bytes of JSON sent in pieces without a Content-Length (the answer ends when the
  connection closes), so only what arrives tells its size
"""
import contextlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Received:
    method: str
    path: str
    query: list
    headers: dict
    body: bytes


@dataclass
class Endpoint:
    url: str
    received: list = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


def _handler(endpoint: Endpoint):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            split = urlsplit(self.path)
            endpoint.received.append(Received(self.command, split.path, parse_qsl(split.query, keep_blank_values=True),
                                              dict(self.headers.items()), body))
            if split.path.startswith("/echo"):
                echoed = {"method": self.command, "path": split.path, "query": split.query,
                          "authorization": self.headers.get("Authorization"),
                          "body": json.loads(body) if body else None, "items": [{"id": 7}, {"id": 8}]}
                self._answer(200, json.dumps(echoed).encode(), "application/json")
            elif split.path.startswith("/bearer/"):  # only this bearer token is taken; any other is a 401
                wanted = "Bearer " + split.path.removeprefix("/bearer/")
                if self.headers.get("Authorization") == wanted:
                    self._answer(200, json.dumps({"taken": True}).encode(), "application/json")
                else:
                    self._answer(401, json.dumps({"error": "invalid_token"}).encode(), "application/json")
            elif split.path == "/text":
                self._answer(200, b"plain words", "text/plain; charset=utf-8")
            elif split.path == "/fail":
                self._answer(500, f"boom, you sent {self.headers.get('Authorization')}".encode(), "text/plain")
            elif split.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif split.path == "/busy":
                self._answer(503, b"try later", "text/plain")
            elif split.path.startswith("/stream/"):
                size = int(split.path.rsplit("/", 1)[1])
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                body = b'"' + b"x" * max(0, size - 2) + b'"'
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client may stop reading
                    for start in range(0, len(body), 4096):
                        self.wfile.write(body[start:start + 4096])
            elif split.path == "/bare":
                self.send_response(200)
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"bare")
            elif split.path == "/drip":
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client may stop reading
                    while not endpoint.release.wait(0.05):
                        self.wfile.write(b"drop ")
                        self.wfile.flush()
            elif split.path == "/slow":
                endpoint.release.wait(30)
                # the client gave up long ago: that is what this path is for
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._answer(200, b"late", "text/plain")
            else:
                self._answer(404, b"no such page", "text/plain")

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    return Handler


def serve():
    """Start the server; yields the Endpoint (a generator for a fixture)."""
    endpoint = Endpoint(url="")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(endpoint))
    server.daemon_threads = True
    endpoint.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        endpoint.release.set()
        server.shutdown()
        server.server_close()
