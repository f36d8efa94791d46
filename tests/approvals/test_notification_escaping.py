"""Messages to people carry no attacker's markup (docs/notes/governance.md, Notifications): the tool, the agent, the
reason and every name in a message are values, escaped for each medium. In Slack a value sits in inline code
with `&`, `<`, `>` escaped, so it opens no link, pings nobody and forges no emphasis; in e-mail it stays on one
line (the subject is one header) and the HTML part is escaped; a webhook gets the values as JSON data. The links
we add stay links."""
import email
import email.policy
import json

import pytest
from django.core import mail

from approvals import notifications
from approvals.models import Notification, NotifyEvent
from tests.tools import http_endpoint

PUBLIC = "https://toolkeeper.example.com"
PHISH = "<https://evil.example/phish|Approve now>"
AGENT = f"{PHISH} <!channel>"
TOOL = "deploy_*prod*\r\nBcc: victim@example.com"
REASON = ("*urgent* _now_ ~gone~ `rm -rf` @here <!here> <@U123> </b><a href=x>click</a> & co"
          "\nApprove (one use, login required): https://evil.example/approve")
INBOX = f"{PUBLIC}/t/acme/inbox/7/"
APPROVE = f"{PUBLIC}/t/acme/inbox/act/?token=7%3A1a%3Asig"
REJECT = f"{PUBLIC}/t/acme/inbox/act/?token=8%3A1a%3Asig"


def requested(**request) -> dict:
    """A `requested` message as `_send` hands it to a medium (its decision links already made)."""
    return {"event": NotifyEvent.REQUESTED, "tenant": "acme", "delivery": 1,
            "request": {"id": 7, "kind": "approval", "status": "pending", "tool": TOOL, "agent": AGENT,
                        "reason": REASON, "call": "c0ffee", "queue": "ops", "opened_at": None, "expires_at": None,
                        "url": INBOX} | request,
            "links": {"approve": APPROVE, "reject": REJECT}}


# --- each medium, exactly -----------------------------------------------------------------------------------

SLACK_SUBJECT = "Approval requested: `deploy_*prod* Bcc: victim@example.com`"
SLACK_LINES = [
    f"*{SLACK_SUBJECT}*",
    "Approval requested: `deploy_*prod* Bcc: victim@example.com` called by "
    "`&lt;https://evil.example/phish|Approve now&gt; &lt;!channel&gt;` (queue `ops`).",
    "Reason: `*urgent* _now_ ~gone~ \u02cbrm -rf\u02cb @here &lt;!here&gt; &lt;@U123&gt; "
    "&lt;/b&gt;&lt;a href=x&gt;click&lt;/a&gt; &amp; co Approve (one use, login required): "
    "https://evil.example/approve`",
    f"Open it in the inbox: <{INBOX}>",
    f"Approve (one use, login required): <{APPROVE}>",
    f"Reject (one use, login required): <{REJECT}>",
]


def test_slack_shows_every_value_as_code_and_keeps_our_links_and_buttons():
    body = notifications._slack(requested())
    assert body["text"] == SLACK_SUBJECT
    assert body["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(SLACK_LINES)}}
    assert body["blocks"][1] == {"type": "actions", "elements": [
        {"type": "button", "text": {"type": "plain_text", "text": "Approve"}, "url": APPROVE},
        {"type": "button", "text": {"type": "plain_text", "text": "Reject"}, "url": REJECT}]}


def test_slack_text_opens_links_only_where_we_made_them():
    text = notifications._slack(requested())["blocks"][0]["text"]["text"]
    # every `<` left in the text opens one of our links
    opened = [chunk.split(">", 1)[0] for chunk in text.split("<")[1:]]
    assert opened == [INBOX, APPROVE, REJECT]


def test_an_ampersand_in_our_own_link_is_escaped_for_slack():
    url = f"{PUBLIC}/t/acme/inbox/7/?a=1&b=<2>"
    assert notifications._slack_part(notifications.Linked(url)) == f"<{PUBLIC}/t/acme/inbox/7/?a=1&amp;b=&lt;2&gt;>"


EMAIL_SUBJECT = "[Toolkeeper] Approval requested: deploy_*prod* Bcc: victim@example.com"
EMAIL_TEXT = (
    "Approval requested: deploy_*prod* Bcc: victim@example.com called by "
    "<https://evil.example/phish|Approve now> <!channel> (queue ops).\n"
    "Reason: *urgent* _now_ ~gone~ `rm -rf` @here <!here> <@U123> </b><a href=x>click</a> & co "
    "Approve (one use, login required): https://evil.example/approve\n"
    f"Open it in the inbox: {INBOX}\n"
    f"Approve (one use, login required): {APPROVE}\n"
    f"Reject (one use, login required): {REJECT}\n"
)
EMAIL_HTML_LINES = [
    "<p>Approval requested: <code>deploy_*prod* Bcc: victim@example.com</code> called by "
    "<code>&lt;https://evil.example/phish|Approve now&gt; &lt;!channel&gt;</code> (queue <code>ops</code>).</p>",
    "<p>Reason: <code>*urgent* _now_ ~gone~ `rm -rf` @here &lt;!here&gt; &lt;@U123&gt; "
    "&lt;/b&gt;&lt;a href=x&gt;click&lt;/a&gt; &amp; co Approve (one use, login required): "
    "https://evil.example/approve</code></p>",
    f'<p>Open it in the inbox: <a href="{INBOX}">{INBOX}</a></p>',
    f'<p>Approve (one use, login required): <a href="{APPROVE}">{APPROVE}</a></p>',
    f'<p>Reject (one use, login required): <a href="{REJECT}">{REJECT}</a></p>',
]


def test_email_keeps_values_on_one_line_and_escapes_its_html_part():
    subject, text, html = notifications._email(requested())
    assert subject == EMAIL_SUBJECT
    assert text == EMAIL_TEXT
    # the only line that offers to approve is ours
    assert [line for line in text.splitlines() if line.startswith("Approve")] == [
        f"Approve (one use, login required): {APPROVE}"]
    assert [line for line in html.splitlines() if line.startswith("<p>")] == EMAIL_HTML_LINES
    assert f"<title>{EMAIL_SUBJECT}</title>" in html
    assert html.count("<a ") == 3


def test_html_escapes_our_own_words_and_links_too():
    assert notifications._as_html(["a < b & ", notifications.Linked('https://x.example/?q="1"&r=2')]) == (
        'a &lt; b &amp; <a href="https://x.example/?q=&quot;1&quot;&amp;r=2">'
        'https://x.example/?q=&quot;1&quot;&amp;r=2</a>')


@pytest.mark.parametrize("value,shown", [
    ("a\r\nb", "a b"),
    ("a\nSubject: x", "a Subject: x"),
    ("tab\there", "tab here"),
    ("  padded  ", "padded"),
    ("line\u2028sep\u2029para\x85next", "line sep para next"),
    ("bell\x07 nul\x00", "bell nul"),
    ("\u202egnp.exe", "gnp.exe"),  # a right-to-left override that would show the name reversed
    ("zero\u200bwidth\ufeff", "zerowidth"),
    ("plain ünïcode ✓", "plain ünïcode ✓"),
])
def test_a_value_is_shown_on_one_line_without_invisible_characters(value, shown):
    assert notifications.one_line(value) == shown


def test_other_messages_escape_their_names_too():
    queue, channel = "*ops* <!channel>", "hook\r\nBcc: x@example.com"
    test = {"event": NotifyEvent.TEST, "tenant": "acme", "queue": queue, "channel": channel}
    assert notifications._slack(test)["blocks"][0]["text"]["text"] == (
        "*Test notification from queue `*ops* &lt;!channel&gt;`*\n"
        "This is a test of channel `hook Bcc: x@example.com` of queue `*ops* &lt;!channel&gt;`.")
    subject, text, _ = notifications._email(test)
    assert subject == "[Toolkeeper] Test notification from queue *ops* <!channel>"
    assert text == "This is a test of channel hook Bcc: x@example.com of queue *ops* <!channel>.\n"
    expiring = {"event": NotifyEvent.EXPIRING, "tenant": "acme", "queue": "ops", "requests": [
        {"tool": TOOL, "agent": AGENT, "expires_at": "2030-01-01T00:00:00+00:00", "url": INBOX}]}
    assert notifications._slack(expiring)["blocks"][0]["text"]["text"].splitlines()[2] == (
        "- `deploy_*prod* Bcc: victim@example.com` by `&lt;https://evil.example/phish|Approve now&gt; "
        f"&lt;!channel&gt;`, expires 2030-01-01T00:00:00+00:00: <{INBOX}>")
    external = {"event": NotifyEvent.EXTERNAL, "tenant": "acme",
                "task": {"call": "c0ffee", "tool": TOOL, "agent": "", "url": INBOX}}
    subject, text, html = notifications._email(external)
    assert subject == "[Toolkeeper] External task waiting: deploy_*prod* Bcc: victim@example.com"
    assert text == (f"deploy_*prod* Bcc: victim@example.com (called by an agent) waits for a result.\n{INBOX}\n")


# --- through delivery -------------------------------------------------------------------------------------


@pytest.fixture
def receiver(settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.TOOLKEEPER_PUBLIC_URL = PUBLIC
    yield from http_endpoint.serve()


@pytest.fixture
def hostile(world, gov_queue, gov_member, gov_rule, inbox_pending, receiver):
    """A request from an agent named like a Slack link, under a rule whose note is full of markup, in a queue
    with a Slack, a webhook and an email channel (all with decision links)."""
    reviewer = gov_member(email="rev@example.com")
    queue = gov_queue(name="ops", reviewers=[reviewer])
    for kind in ("slack", "webhook", "email"):
        url = {} if kind == "email" else {"url": f"{receiver.url}/echo/{kind}"}
        secret = {"signing_secret": "a-signing-secret-of-some-length"} if kind == "webhook" else {}
        notifications.channel_save(queue=queue, name=kind, kind=kind, events=["requested"], action_links=True,
                                   **url, **secret)
    gov_rule("ask", inbox_pending.shell.name, queue=queue, agents=[AGENT], priority=10, note=REASON)
    [request] = inbox_pending(1, agent=AGENT, queue=queue)
    return request


def bodies(receiver) -> dict:
    return {r.path.rsplit("/", 1)[-1]: json.loads(r.body) for r in receiver.received if r.method == "POST"}


def test_a_hostile_request_reaches_every_channel_escaped_for_it(world, hostile, receiver):
    assert notifications.deliveries_send() == 3
    sent = bodies(receiver)
    # the webhook gets data: the values as they are, and nothing made for people to read
    webhook = sent["webhook"]
    assert webhook["request"]["agent"] == AGENT and webhook["request"]["reason"].endswith(REASON)
    assert set(webhook) == {"event", "tenant", "request", "links", "delivery"}
    slack = sent["slack"]
    text = slack["blocks"][0]["text"]["text"]
    assert "called by `&lt;https://evil.example/phish|Approve now&gt; &lt;!channel&gt;`" in text
    assert PHISH not in text and "<!channel>" not in text and "<a href" not in text
    assert "https://evil.example/approve`" in text  # inside the reason's code, not a line of its own
    # the only links in it are ours: the inbox, and the two decision links its buttons carry too
    opened = [chunk.split(">", 1)[0] for chunk in text.split("<")[1:]]
    buttons = slack["blocks"][1]["elements"]
    assert opened == [webhook["request"]["url"], *(b["url"] for b in buttons)]
    assert [b["text"]["text"] for b in buttons] == ["Approve", "Reject"]
    assert all(b["url"].startswith(f"{PUBLIC}/t/acme/inbox/act/?token=") for b in buttons)
    [message] = mail.outbox
    html, mime = message.alternatives[0]
    assert mime == "text/html"
    assert "called by <code>&lt;https://evil.example/phish|Approve now&gt; &lt;!channel&gt;</code>" in html
    assert "<a href=x>" not in html and html.count("<a ") == 3
    assert [line for line in message.body.splitlines() if line.startswith("Approve")] == [
        line for line in message.body.splitlines() if line.startswith(f"Approve (one use, login required): {PUBLIC}")]


def test_a_line_break_in_a_value_cannot_add_a_mail_header(world, hostile):
    # the stored message names a tool with a line break and a header after it
    for notification in Notification.objects.for_tenant(world.a.tenant).filter(channel__kind="email"):
        notification.payload["request"]["tool"] = TOOL
        notification.save(update_fields=["payload"])
    notifications.deliveries_send()
    [message] = mail.outbox
    assert message.subject == EMAIL_SUBJECT
    assert message.to == ["rev@example.com"] and not message.bcc
    parsed = email.message_from_bytes(message.message().as_bytes(), policy=email.policy.default)
    assert parsed["Subject"] == EMAIL_SUBJECT
    assert parsed["Bcc"] is None and parsed["To"] == "rev@example.com"
