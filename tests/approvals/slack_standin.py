"""A stand-in for Slack in the tests of decisions from Slack (approvals.slack).

It does what Slack does around an interactive message: it builds a `block_actions` payload for a click, sends it
form-encoded (`payload=<JSON>`) signed exactly as Slack documents (https://api.slack.com/authentication/
verifying-requests-from-slack: `X-Slack-Signature: v0=` + hex HMAC-SHA256 under the app's signing secret of
`v0:<X-Slack-Request-Timestamp>:<raw body>`), and receives what Toolkeeper posts to the payload's `response_url`
on a real HTTP server on 127.0.0.1 (tests.tools.http_endpoint). The signature is computed here, independently of
the platform's code.
"""
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from tests.tools import http_endpoint

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # noqa: S105 (Slack's documented example shape)
TEAM = "T0TKTEAM"
BUTTONS = {"approve": "toolkeeper_approve", "reject": "toolkeeper_reject", "view": "toolkeeper_view"}


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


@dataclass
class Click:
    body: bytes
    headers: dict


class SlackStandin:
    """`click(...)` makes a signed interaction; `send(client, url, click)` posts it; `replies()` are the JSON
    bodies Toolkeeper posted back to the response_url, oldest first."""

    def __init__(self, endpoint, secret: str = SIGNING_SECRET, team: str = TEAM):
        self.endpoint = endpoint
        self.secret = secret
        self.team = team
        self._seq = 0

    @property
    def response_url(self) -> str:
        return self.endpoint.url + "/echo/slack-response"

    def payload(self, *, user: str, action: str, request_id, response_url: str | None = None) -> dict:
        self._seq += 1
        return {
            "type": "block_actions", "team": {"id": self.team, "domain": "example"},
            "user": {"id": user, "username": user.lower(), "team_id": self.team},
            "api_app_id": "A0TOOLKEEPER", "trigger_id": f"{self._seq}.1.abc",
            "container": {"type": "message", "message_ts": "1700000000.000100", "channel_id": "C0REVIEW"},
            "channel": {"id": "C0REVIEW", "name": "reviews"},
            "response_url": response_url or f"{self.response_url}/{self._seq}",
            "actions": [{"type": "button", "action_id": BUTTONS.get(action, action), "block_id": "b1",
                         "text": {"type": "plain_text", "text": action}, "value": str(request_id),
                         "action_ts": f"1700000000.{self._seq:06d}"}],
        }

    def sign(self, body: bytes, *, timestamp: int | None = None, secret: str | None = None) -> Click:
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        return Click(body=body, headers={
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": slack_signature(secret or self.secret, stamp, body)})

    def click(self, *, user: str, action: str, request_id, timestamp: int | None = None, secret: str | None = None,
              payload: dict | None = None, **extra) -> Click:
        data = payload if payload is not None else self.payload(user=user, action=action, request_id=request_id,
                                                                **extra)
        body = urlencode({"payload": json.dumps(data)}).encode()
        return self.sign(body, timestamp=timestamp, secret=secret)

    @staticmethod
    def send(client, url: str, click: Click):
        """Post a click with the Django test client (or anything with its `post`)."""
        headers = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in click.headers.items()}
        return client.post(url, data=click.body, content_type="application/x-www-form-urlencoded", **headers)

    def replies(self) -> list[dict]:
        return [json.loads(r.body) for r in self.endpoint.received
                if r.method == "POST" and r.path.startswith("/echo/slack-response")]


def serve(secret: str = SIGNING_SECRET):
    """Yields a SlackStandin whose response_url server runs until the generator ends (for a fixture)."""
    for endpoint in http_endpoint.serve():
        yield SlackStandin(endpoint, secret=secret)
