"""An MCP server and its authorization server on one port of 127.0.0.1, answering as the MCP authorization
specification has them answer, for the in-process tests of people's own accounts (each test changes one answer
at a time: `documents`). `stand_in` is the fixture (tests/accounts/conftest.py)."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandIn:
    """An MCP server and its authorization server on one port: `documents` maps a path to (status, JSON, headers);
    `/mcp` answers 401 with a `WWW-Authenticate` naming the resource metadata unless `documents` says otherwise."""

    def __init__(self):
        self.documents: dict[str, tuple[int, object, dict]] = {}
        self.requests: list[tuple[str, str, bytes]] = []
        self.headers: list[dict] = []  # each request's, beside `requests`
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stand_in.headers.append(dict(self.headers))
                stand_in.requests.append((self.command, self.path, body))
                status, document, headers = stand_in.documents.get(self.path, (404, {"error": "not_found"}, {}))
                data = document if isinstance(document, bytes) else json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.resource = f"{self.url}/mcp"
        self.set_defaults()

    def set_defaults(self) -> None:
        metadata = f"{self.url}/.well-known/oauth-protected-resource/mcp"
        self.documents = {
            "/mcp": (401, {"error": "invalid_token"}, {"WWW-Authenticate": f'Bearer resource_metadata="{metadata}"'}),
            "/.well-known/oauth-protected-resource/mcp": (200, {
                "resource": self.resource, "authorization_servers": [self.url], "scopes_supported": ["files"]}, {}),
            "/.well-known/oauth-authorization-server": (200, {
                "issuer": self.url, "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token", "registration_endpoint": f"{self.url}/register",
                "revocation_endpoint": f"{self.url}/revoke", "response_types_supported": ["code"],
                "code_challenge_methods_supported": ["S256"]}, {}),
            "/register": (201, {"client_id": "registered-client", "client_secret": "s3cret-of-the-client"}, {}),
            "/token": (200, {"access_token": "access-1", "token_type": "Bearer", "expires_in": 3600,
                             "refresh_token": "refresh-1", "scope": "files"}, {}),
            "/revoke": (200, {}, {}),
        }

    def stop(self):
        self.server.shutdown()
