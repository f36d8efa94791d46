"""An upstream MCP server that requires OAuth, for the tests of people's own accounts (docs/accounts.md): the `mcp`
SDK's `MCPServer` as a protected resource (RFC 9728 metadata, 401 with `WWW-Authenticate`, bearer tokens checked on
every request), trusting the JWT access tokens of the tests' OpenID provider (tests/identity/provider.mjs) issued
for this server's URL, with the `files` scope.

    python -m tests.accounts.upstream PORT ISSUER STATE_FILE

Each call is appended to STATE_FILE, one JSON object a line: the tool, the token's subject (the person upstream)
and its `jti` (which token it was), so a test sees who really called.

Beside it, on the same port, a plain HTTP API for the HTTP tools' providers: `GET /api/whoami` takes the provider's
JWT access tokens issued for `http://127.0.0.1:PORT/api` with the `items` scope (a person's, or a service account's
from client credentials), answers 401 to anything else, and records the call as the MCP tools do (tool `api`, with
the token's `client_id`).
"""
import json
import sys
import time
import urllib.request

import uvicorn
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse
from starlette.routing import Route

SCOPE = "files"
API_SCOPE = "items"


class ProviderTokens:
    """The provider's JWT access tokens: signature (its JWKS), issuer, audience (this server), expiry."""

    def __init__(self, issuer: str, resource: str):
        self.issuer, self.resource = issuer, resource
        self._keys: KeySet | None = None

    def keys(self) -> KeySet:
        if self._keys is None:
            with urllib.request.urlopen(f"{self.issuer}/.well-known/openid-configuration", timeout=10) as answer:
                jwks_uri = json.loads(answer.read())["jwks_uri"]
            with urllib.request.urlopen(jwks_uri, timeout=10) as answer:
                self._keys = KeySet.import_key_set(json.loads(answer.read()))
        return self._keys

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            claims = jwt.decode(token, self.keys(), algorithms=["RS256"]).claims
        except (JoseError, ValueError):
            return None
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if claims.get("iss") != self.issuer or self.resource not in audiences or claims.get("exp", 0) <= time.time():
            return None
        return AccessToken(token=token, client_id=str(claims.get("client_id", "")),
                           scopes=str(claims.get("scope", "")).split(), expires_at=int(claims["exp"]),
                           resource=self.resource, subject=claims.get("sub"), claims=claims)


def build(port: int, issuer: str, state_file: str) -> MCPServer:
    resource = f"http://127.0.0.1:{port}/mcp"
    server = MCPServer("files", token_verifier=ProviderTokens(issuer, resource),
                       auth=AuthSettings(issuer_url=issuer, resource_server_url=resource, required_scopes=[SCOPE]))

    def record(tool: str) -> dict:
        token = get_access_token()
        seen = {"tool": tool, "sub": token.subject, "jti": (token.claims or {}).get("jti")}
        with open(state_file, "a", encoding="utf-8") as out:
            out.write(json.dumps(seen) + "\n")
        return seen

    @server.tool(description="Who the server takes the caller for.")
    def whoami() -> dict:
        return record("whoami")

    @server.tool(description="Lists the caller's files.")
    def list_files() -> dict:
        seen = record("list_files")
        return {"owner": seen["sub"], "files": [f"{seen['sub']}-notes.txt"]}

    return server


def api_route(port: int, issuer: str, state_file: str) -> Route:
    tokens = ProviderTokens(issuer, f"http://127.0.0.1:{port}/api")

    async def whoami(request):
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        verified = await tokens.verify_token(token) if scheme.lower() == "bearer" else None
        if verified is None or API_SCOPE not in verified.scopes:
            return JSONResponse({"error": "invalid_token"}, status_code=401,
                                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        seen = {"tool": "api", "sub": verified.subject, "client_id": verified.client_id,
                "jti": (verified.claims or {}).get("jti")}
        with open(state_file, "a", encoding="utf-8") as out:
            out.write(json.dumps(seen) + "\n")
        return JSONResponse(seen)

    return Route("/api/whoami", whoami, methods=["GET"])


def main(argv: list[str]) -> None:
    port, issuer, state_file = int(argv[0]), argv[1], argv[2]
    security = TransportSecuritySettings(allowed_hosts=[f"127.0.0.1:{port}"])
    app = build(port, issuer, state_file).streamable_http_app(transport_security=security)
    app.router.routes.append(api_route(port, issuer, state_file))
    print(f"upstream ready on {port}", file=sys.stderr, flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
