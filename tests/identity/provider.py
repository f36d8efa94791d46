"""A real OpenID provider for the single sign-on tests: the npm package `oidc-provider` (provider.mjs beside this
file) in a node process on a free port of 127.0.0.1, with one confidential client for a Toolkeeper server and the
accounts a test gives it. `account_set` rewrites an account (to disable a person, or change their groups); the
provider reads the file again at every look-up.
"""
from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.live.server import LiveServer, free_port
from tests.mcp.conformance.node import require_node

HERE = Path(__file__).resolve().parent
CLIENT_ID = "toolkeeper-console"


class OpenIdProvider:
    def __init__(self, accounts: dict[str, dict]):
        self.accounts = {login: dict(fields) for login, fields in accounts.items()}
        self.client_secret = secrets.token_urlsafe(24)
        self.redirect_uris: list[str] = []
        self.post_logout_uris: list[str] = []
        self.backchannel_uri = ""
        self.resources: dict[str, dict] = {}  # other resource servers: {url: {"scope", "ttl"}} (provider.mjs)
        self.port = free_port()  # known before the start: Toolkeeper's servers are configured with the issuer first
        self.process: subprocess.Popen | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="tk-oidc-"))
        self._config = self._dir / "provider.json"
        self._log = self._dir / "provider.log"

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings(self, **more: str) -> dict[str, str]:
        """The environment of a Toolkeeper server that signs in with this provider."""
        return {"TOOLKEEPER_OIDC_ISSUER": self.issuer, "TOOLKEEPER_OIDC_CLIENT_ID": CLIENT_ID,
                "TOOLKEEPER_OIDC_CLIENT_SECRET": self.client_secret, "TOOLKEEPER_OIDC_NAME": "Example SSO",
                "TOOLKEEPER_OIDC_SCOPES": "openid email profile groups", **more}

    def client_for(self, toolkeeper_url: str) -> None:
        """Let the Toolkeeper server at `toolkeeper_url` be the client (before `start`)."""
        self.redirect_uris.append(f"{toolkeeper_url}/login/sso/callback/")
        self.post_logout_uris.append(f"{toolkeeper_url}/login/")
        self.backchannel_uri = f"{toolkeeper_url}/login/sso/logout/"

    def _write(self) -> None:
        client = {"client_id": CLIENT_ID, "client_secret": self.client_secret,
                  "redirect_uris": self.redirect_uris or ["http://127.0.0.1/unused"],
                  "post_logout_redirect_uris": self.post_logout_uris,
                  **({"backchannel_logout_uri": self.backchannel_uri} if self.backchannel_uri else {}),
                  "token_endpoint_auth_method": "client_secret_basic"}
        body = {"port": self.port, "clients": [client], "accounts": self.accounts, "resources": self.resources}
        temporary = self._config.with_suffix(".tmp")
        temporary.write_text(json.dumps(body))
        temporary.replace(self._config)  # the provider never reads half a file

    def account_set(self, login: str, **fields) -> None:
        self.accounts.setdefault(login, {}).update(fields)
        self._write()

    def signed_out(self, login: str) -> list[str]:
        """The provider ends the person's session and tells Toolkeeper by a back-channel logout; the outcome of
        each delivery ("ok", or the error)."""
        request = urllib.request.Request(f"{self.issuer}/test/signed-out/{login}", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["results"]

    def start(self) -> OpenIdProvider:
        """Started after the Toolkeeper servers' URLs are known (its client's redirect URIs are fixed at start)."""
        node = require_node(HERE, ("oidc-provider",))
        self._write()
        self.process = subprocess.Popen([node, str(HERE / "provider.mjs"), str(self._config)], cwd=HERE,
                                        stdout=self._log.open("wb"), stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if "ready " in self.log_tail():
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        log = self.log_tail()
        self.stop()
        raise RuntimeError(f"the OpenID provider did not start:\n{log}")

    def log_tail(self) -> str:
        try:
            return self._log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def deployment_with(accounts: dict[str, dict], **env: str):
    """A Toolkeeper server that signs people in with a fresh provider of `accounts` (its settings and `env`, where
    `{issuer}` stands for the provider's URL), and the provider: (provider, server). Both logs are printed at
    teardown (pytest shows them for a failure)."""
    provider = OpenIdProvider(accounts)
    env = {name: value.replace("{issuer}", provider.issuer) for name, value in env.items()}
    with LiveServer(extra_env=provider.settings(**env)) as server:
        provider.client_for(server.url)
        provider.start()
        try:
            yield provider, server
        finally:
            provider.stop()
            print(f"--- provider log ---\n{provider.log_tail()}\n--- server log ---\n{server.log_tail(20000)}")
