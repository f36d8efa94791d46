"""Decisions from Slack (docs/governance.md, "Deciding from Slack"): signed interactions from a stand-in that signs
exactly as Slack documents, the Slack user linked to a member once through a signed link, and named reviewers,
four-eyes and quorum as in the console; the original message replaced with the outcome through response_url."""
import json
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing
from django.test import Client

from approvals import notifications, slack
from approvals.models import (
    ApprovalRequest,
    RequestStatus,
    SlackIdentity,
    SlackLink,
    SlackSeenRequest,
    Vote,
)
from common.errors import ServiceError
from tenancy.entry import limits
from tenancy.models import Role, Tenant
from tests.approvals import slack_standin
from tests.approvals.slack_standin import SIGNING_SECRET

ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"


@pytest.fixture
def standin(settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.TOOLKEEPER_SLACK_RESPONSE_HOSTS = ["127.0.0.1"]
    yield from slack_standin.serve()


@pytest.fixture
def slack_channel(standin):
    def make(queue, **values):
        return notifications.channel_save(queue=queue, name="slack", kind="slack", events=["requested"],
                                          url=standin.endpoint.url + "/echo/webhook",
                                          slack_signing_secret=SIGNING_SECRET, **values)
    return make


def interaction_url(channel) -> str:
    return f"/integrations/slack/{channel.public_id}/"


def linked(world, user, slack_user: str):
    return SlackIdentity.objects.create(tenant=world.a.tenant, team_id=slack_standin.TEAM, slack_user_id=slack_user,
                                        user=user)


def click(standin, channel, *, user: str, action: str, request, **extra):
    return standin.send(Client(), interaction_url(channel),
                        standin.click(user=user, action=action, request_id=request.pk, **extra))


def votes(request) -> list:
    return list(Vote.objects.for_tenant(request.tenant_id).filter(request=request).values_list("reviewer_id",
                                                                                                flat=True))


def status_of(request) -> str:
    return ApprovalRequest.objects.for_tenant(request.tenant_id).get(pk=request.pk).status


def console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- the message --------------------------------------------------------------------------------------------------

def test_an_interactive_channel_sends_buttons_that_carry_only_the_request_id_and_escapes_hostile_names(
        world, gov_queue, slack_channel, standin, inbox_pending):
    queue = gov_queue()
    channel = slack_channel(queue)
    hostile = "<!channel> *boss* <https://evil.example|click> & `x`"
    [request] = inbox_pending(1, queue=queue, agent=hostile, command="rm -rf /secret-path")
    assert notifications.deliveries_send() == 1
    [sent] = [r for r in standin.endpoint.received if r.path == "/echo/webhook"]
    message = json.loads(sent.body)
    text = json.dumps(message)
    assert "<!channel>" not in text and "<https://evil" not in text and "secret-path" not in text
    section = message["blocks"][0]["text"]["text"]
    assert "`&lt;!channel&gt; *boss* &lt;https://evil.example|click&gt; &amp; \u02cbx\u02cb`" in section
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    assert [(b["action_id"], b["value"]) for b in actions["elements"]] == [
        ("toolkeeper_approve", str(request.pk)), ("toolkeeper_reject", str(request.pk)),
        ("toolkeeper_view", str(request.pk))]
    assert SIGNING_SECRET not in text
    # the secret is write-only: the channel page shows the interaction URL, never the secret
    page = console(world.a.users["admin"]).get(f"/t/acme/queues/{queue.pk}/notifications/").content.decode()
    assert str(channel.public_id) in page and SIGNING_SECRET not in page


def test_a_slack_signing_secret_is_for_slack_channels_only(gov_queue, standin):
    with pytest.raises(ServiceError) as refused:
        notifications.channel_save(queue=gov_queue(), name="hook", kind="webhook", events=["requested"],
                                   url=standin.endpoint.url + "/echo/x", signing_secret="s" * 20,
                                   slack_signing_secret=SIGNING_SECRET)
    assert "slack_signing_secret" in refused.value.fields


# --- verifying ----------------------------------------------------------------------------------------------------

def test_a_good_signature_decides_and_replaces_the_message_with_the_outcome(world, gov_queue, gov_member,
                                                                           slack_channel, standin, inbox_pending):
    queue = gov_queue()
    channel = slack_channel(queue)
    reviewer = gov_member()
    linked(world, reviewer, ALICE)
    [request] = inbox_pending(1, queue=queue)
    response = click(standin, channel, user=ALICE, action="approve", request=request)
    assert response.status_code == 200
    assert status_of(request) == RequestStatus.APPROVED and votes(request) == [reviewer.pk]
    [reply] = standin.replies()
    assert reply["replace_original"] is True
    assert "Request approved" in reply["text"]
    assert f"Approved from Slack by `{reviewer.username}`" in reply["blocks"][0]["text"]["text"]
    assert not [b for b in reply["blocks"] if b["type"] == "actions"]  # decided: no buttons any more


def test_reject_from_slack_rejects_with_a_fixed_message(world, gov_queue, gov_member, slack_channel, standin,
                                                       inbox_pending):
    queue = gov_queue()
    channel = slack_channel(queue)
    linked(world, gov_member(), ALICE)
    [request] = inbox_pending(1, queue=queue)
    assert click(standin, channel, user=ALICE, action="reject", request=request).status_code == 200
    assert status_of(request) == RequestStatus.REJECTED
    assert Vote.objects.for_tenant(world.a.tenant).get(request=request).message == slack.REJECT_MESSAGE
    assert "Request rejected" in standin.replies()[0]["text"]


@pytest.mark.parametrize("how", ["other secret", "changed body", "no signature"])
def test_a_bad_signature_is_401_and_decides_nothing(world, gov_queue, gov_member, slack_channel, standin,
                                                    inbox_pending, how):
    queue = gov_queue()
    channel = slack_channel(queue)
    linked(world, gov_member(), ALICE)
    [request] = inbox_pending(1, queue=queue)
    signed = standin.click(user=ALICE, action="approve", request_id=request.pk,
                           secret="another-secret-of-some-length" if how == "other secret" else None)
    if how == "changed body":
        signed.body = signed.body.replace(b"toolkeeper_approve", b"toolkeeper_reject")
    if how == "no signature":
        del signed.headers["X-Slack-Signature"]
    response = standin.send(Client(), interaction_url(channel), signed)
    assert response.status_code == 401
    assert status_of(request) == RequestStatus.PENDING and votes(request) == [] and standin.replies() == []


@pytest.mark.parametrize("offset", [-6 * 60, 6 * 60])
def test_an_old_or_future_timestamp_is_401(world, gov_queue, gov_member, slack_channel, standin, inbox_pending,
                                           offset):
    queue = gov_queue()
    channel = slack_channel(queue)
    linked(world, gov_member(), ALICE)
    [request] = inbox_pending(1, queue=queue)
    response = click(standin, channel, user=ALICE, action="approve", request=request,
                     timestamp=int(time.time()) + offset)
    assert response.status_code == 401 and b"five minutes" in response.content
    assert status_of(request) == RequestStatus.PENDING


def test_a_replay_is_refused_by_any_process_through_the_database(world, gov_queue, gov_member, slack_channel,
                                                                 standin, inbox_pending):
    queue = gov_queue(required_approvals=2)
    channel = slack_channel(queue)
    linked(world, gov_member(), ALICE)
    [request] = inbox_pending(1, queue=queue)
    signed = standin.click(user=ALICE, action="view", request_id=request.pk)
    assert standin.send(Client(), interaction_url(channel), signed).status_code == 200
    assert SlackSeenRequest.objects.for_tenant(world.a.tenant).filter(channel=channel).count() == 1
    replayed = standin.send(Client(), interaction_url(channel), signed)
    assert replayed.status_code == 409 and len(standin.replies()) == 1


@pytest.mark.parametrize("body", [
    b"payload=%7Bnot+json", b"payload=%5B1%2C2%5D", b"payload=NaN", b"nothing=here", b"\xff\xfe",
    b"payload=" + json.dumps({"type": "block_actions", "user": {"id": "U1"}, "team": {"id": "T1"},
                              "actions": [{"action_id": "toolkeeper_approve", "value": "1e9"}]}).encode(),
    b"payload=" + json.dumps({"type": "view_submission"}).encode(),
], ids=["broken", "list", "nan", "no-payload", "not-utf8", "bad-value", "other-type"])
def test_hostile_bodies_are_400_never_500(world, gov_queue, slack_channel, standin, body):
    channel = slack_channel(gov_queue())
    response = standin.send(Client(), interaction_url(channel), standin.sign(body))
    assert response.status_code == 400


def test_a_response_url_off_slack_s_hosts_is_refused(world, gov_queue, gov_member, slack_channel, standin,
                                                     inbox_pending):
    queue = gov_queue()
    channel = slack_channel(queue)
    linked(world, gov_member(), ALICE)
    [request] = inbox_pending(1, queue=queue)
    response = click(standin, channel, user=ALICE, action="approve", request=request,
                     response_url="http://169.254.169.254/latest/meta-data/")
    assert response.status_code == 400 and status_of(request) == RequestStatus.PENDING


def test_an_oversized_body_and_an_unknown_channel_are_refused(world, gov_queue, slack_channel, standin):
    channel = slack_channel(gov_queue())
    big = standin.sign(b"payload=" + b"x" * (slack.MAX_BODY_BYTES + 1))
    assert standin.send(Client(), interaction_url(channel), big).status_code == 413
    unknown = "/integrations/slack/00000000-0000-4000-8000-000000000000/"
    assert standin.send(Client(), unknown, standin.sign(b"payload=%7B%7D")).status_code == 404


# --- linking ------------------------------------------------------------------------------------------------------

def _link_path(reply: dict) -> str:
    url = reply["text"].split("<", 1)[1].split("|", 1)[0].replace("&amp;", "&")
    split = urlsplit(url)
    return f"{split.path}?{split.query}"


def test_an_unlinked_user_gets_a_link_and_no_vote_and_the_link_links_once(world, gov_queue, gov_member,
                                                                          slack_channel, standin, inbox_pending):
    queue = gov_queue()
    channel = slack_channel(queue)
    [request] = inbox_pending(1, queue=queue)
    assert click(standin, channel, user=BOB, action="approve", request=request).status_code == 200
    [reply] = standin.replies()
    assert reply["response_type"] == "ephemeral" and reply["replace_original"] is False
    assert votes(request) == [] and status_of(request) == RequestStatus.PENDING
    path = _link_path(reply)
    assert path.startswith("/t/acme/inbox/slack/link/?token=")
    bob = gov_member()
    page = console(bob).get(path)
    assert page.status_code == 200 and BOB in page.content.decode()
    assert console(bob).post(path).status_code == 302
    identity = SlackIdentity.objects.for_tenant(world.a.tenant).get()
    assert (identity.user, identity.team_id, identity.slack_user_id) == (bob, slack_standin.TEAM, BOB)
    # a second use is refused, by anyone
    again = console(gov_member()).post(path)
    assert again.status_code == 410 and "used already" in again.content.decode()
    assert SlackIdentity.objects.for_tenant(world.a.tenant).get().user == bob
    # now the same click decides, as bob
    assert click(standin, channel, user=BOB, action="approve", request=request).status_code == 200
    assert votes(request) == [bob.pk] and status_of(request) == RequestStatus.APPROVED


def test_a_link_of_another_tenant_or_an_expired_one_links_nothing(world, gov_queue, gov_member, slack_channel,
                                                                  standin, inbox_pending):
    queue = gov_queue()
    channel = slack_channel(queue)
    [request] = inbox_pending(1, queue=queue)
    click(standin, channel, user=BOB, action="approve", request=request)
    path = _link_path(standin.replies()[0])
    token = parse_qs(urlsplit(path).query)["token"][0]
    outsider = gov_member(tenant=world.b.tenant)
    # tenant A's page is not theirs; under their own tenant the token names nothing
    assert console(outsider).post(path).status_code == 404
    foreign = console(outsider).post(f"/t/{world.b.tenant.slug}/inbox/slack/link/?token={token}")
    assert foreign.status_code == 410 and "not valid" in foreign.content.decode()
    # a link older than its age is refused
    link = SlackLink.objects.for_tenant(world.a.tenant).get()

    class Earlier(signing.TimestampSigner):
        def timestamp(self):
            return signing.b62_encode(int(time.time()) - slack.LINK_MAX_AGE_S - 60)

    old = Earlier(salt=slack.LINK_SALT).sign(str(link.pk))
    expired = console(gov_member()).post(f"/t/acme/inbox/slack/link/?token={old}")
    assert expired.status_code == 410 and "expired" in expired.content.decode()
    assert not SlackIdentity.objects.for_tenant(world.a.tenant).exists()


def test_a_member_unlinks_their_own_slack_user_and_no_one_else_s(world, gov_member):
    bob, other = gov_member(), gov_member()
    identity = linked(world, bob, BOB)
    assert console(other).post("/t/acme/inbox/notifications/slack/unlink/",
                               {"identity": identity.pk}).status_code == 302
    assert SlackIdentity.objects.for_tenant(world.a.tenant).filter(pk=identity.pk).exists()
    page = console(bob).get("/t/acme/inbox/notifications/").content.decode()
    assert BOB in page
    assert console(bob).post("/t/acme/inbox/notifications/slack/unlink/", {"identity": identity.pk}).status_code == 302
    assert not SlackIdentity.objects.for_tenant(world.a.tenant).exists()


def test_a_linked_user_who_no_longer_reviews_is_refused(world, gov_queue, gov_member, slack_channel, standin,
                                                       inbox_pending):
    queue = gov_queue()
    channel = slack_channel(queue)
    linked(world, gov_member(role=Role.VIEWER), ALICE)
    [request] = inbox_pending(1, queue=queue)
    for action in ("approve", "view"):
        assert click(standin, channel, user=ALICE, action=action, request=request).status_code == 200
    assert votes(request) == [] and status_of(request) == RequestStatus.PENDING
    assert all("does not review" in reply["text"] and reply["response_type"] == "ephemeral"
               for reply in standin.replies())


# --- the console's rules, in Slack --------------------------------------------------------------------------------

def test_four_eyes_refuses_the_session_s_own_user(world, gov_queue, gov_member, slack_channel, standin,
                                                  inbox_pending):
    queue = gov_queue(four_eyes=True)
    channel = slack_channel(queue)
    linked(world, gov_member(email="carol@example.com"), CAROL)
    [request] = inbox_pending(1, queue=queue, user="carol@example.com")
    assert click(standin, channel, user=CAROL, action="approve", request=request).status_code == 200
    [reply] = standin.replies()
    assert reply["response_type"] == "ephemeral" and "four-eyes" in reply["text"]
    assert votes(request) == [] and status_of(request) == RequestStatus.PENDING


def test_quorum_of_two_the_first_vote_leaves_it_pending_and_the_message_says_so(world, gov_queue, gov_member,
                                                                               slack_channel, standin,
                                                                               inbox_pending):
    queue = gov_queue(required_approvals=2)
    channel = slack_channel(queue)
    alice, bob = gov_member(), gov_member()
    linked(world, alice, ALICE)
    linked(world, bob, BOB)
    [request] = inbox_pending(1, queue=queue)
    click(standin, channel, user=ALICE, action="approve", request=request)
    assert status_of(request) == RequestStatus.PENDING
    [first] = standin.replies()
    assert first["replace_original"] is True and "1 of 2 approvals, still pending" in first["blocks"][0]["text"]["text"]
    assert [b for b in first["blocks"] if b["type"] == "actions"]  # still pending: the buttons stay
    # one vote each
    click(standin, channel, user=ALICE, action="approve", request=request)
    assert "you have voted" in standin.replies()[1]["text"] and votes(request) == [alice.pk]
    click(standin, channel, user=BOB, action="approve", request=request)
    assert status_of(request) == RequestStatus.APPROVED
    assert "Request approved" in standin.replies()[2]["text"]


def test_named_reviewers_are_enforced(world, gov_queue, gov_member, slack_channel, standin, inbox_pending):
    named, other = gov_member(), gov_member()
    queue = gov_queue(reviewers=[named])
    channel = slack_channel(queue)
    linked(world, other, BOB)
    linked(world, named, ALICE)
    [request] = inbox_pending(1, queue=queue)
    click(standin, channel, user=BOB, action="approve", request=request)
    assert "not a reviewer of this request's queue" in standin.replies()[0]["text"] and votes(request) == []
    click(standin, channel, user=ALICE, action="approve", request=request)
    assert status_of(request) == RequestStatus.APPROVED and votes(request) == [named.pk]


def test_view_input_shows_the_input_to_an_eligible_reviewer_only(world, gov_queue, gov_member, slack_channel,
                                                                 standin, inbox_pending):
    named, other = gov_member(), gov_member()
    queue = gov_queue(reviewers=[named])
    channel = slack_channel(queue)
    linked(world, other, BOB)
    linked(world, named, ALICE)
    [request] = inbox_pending(1, queue=queue, command="echo <!here> & `done`")
    click(standin, channel, user=BOB, action="view", request=request)
    [refused] = standin.replies()
    assert "not a reviewer" in refused["text"] and "echo" not in refused["text"]
    click(standin, channel, user=ALICE, action="view", request=request)
    shown = standin.replies()[1]
    assert shown["response_type"] == "ephemeral" and shown["replace_original"] is False
    assert "echo &lt;!here&gt; &amp; `done`" in shown["text"] and "<!here>" not in shown["text"]
    assert status_of(request) == RequestStatus.PENDING and votes(request) == []


def test_a_request_of_another_queue_or_tenant_is_not_decided_through_this_channel(world, gov_queue, gov_member,
                                                                                  slack_channel, standin,
                                                                                  inbox_pending):
    channel = slack_channel(gov_queue())
    linked(world, gov_member(), ALICE)
    [elsewhere] = inbox_pending(1, queue=gov_queue())
    click(standin, channel, user=ALICE, action="approve", request=elsewhere)
    assert "no such request" in standin.replies()[0]["text"]
    assert status_of(elsewhere) == RequestStatus.PENDING


def test_a_click_is_admitted_as_the_linked_member_and_counts_against_their_limits(world, gov_queue, gov_member,
                                                                                  slack_channel, standin,
                                                                                  inbox_pending, monkeypatch):
    queue = gov_queue(required_approvals=2)
    channel = slack_channel(queue)
    alice = gov_member()
    linked(world, alice, ALICE)
    [request] = inbox_pending(1, queue=queue)
    monkeypatch.setattr(limits.time, "time", lambda: 1_800_000_030.0)
    limits.counter_store().clear()
    Tenant.objects.filter(pk=world.a.tenant.pk).update(key_requests_per_minute=1)
    try:
        click(standin, channel, user=ALICE, action="view", request=request)
        click(standin, channel, user=ALICE, action="approve", request=request)
    finally:
        limits.counter_store().clear()
    shown, refused = standin.replies()
    assert "ls -la" in shown["text"]
    assert "Rate limit reached" in refused["text"] and votes(request) == []


def test_the_api_takes_the_slack_signing_secret_write_only_and_shows_the_public_id(world, gov_queue, standin,
                                                                                 gov_console_api):
    queue = gov_queue()
    api = gov_console_api(world.a.users["admin"], world.a.tenant)
    response = api.post("/api/v1/notify-channels", {
        "queue": queue.name, "name": "slack", "kind": "slack", "events": ["requested"],
        "url": standin.endpoint.url + "/echo/webhook", "slack_signing_secret": SIGNING_SECRET}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert SIGNING_SECRET not in response.content.decode() and "slack_signing_secret" not in body
    channel = notifications.NotificationChannel.objects.for_tenant(world.a.tenant).get(pk=body["id"])
    assert body["public_id"] == str(channel.public_id) and notifications.slack_interactive(channel)
    listed = api.get("/api/v1/notify-channels").content.decode()
    assert SIGNING_SECRET not in listed


@pytest.mark.parametrize("stamp", ["\u00b2", "-1", "", "1" * 40])
def test_a_malformed_timestamp_is_401(world, gov_queue, slack_channel, standin, stamp):
    channel = slack_channel(gov_queue())
    signed = standin.click(user=ALICE, action="approve", request_id=1)
    signed.headers["X-Slack-Request-Timestamp"] = stamp
    assert standin.send(Client(), interaction_url(channel), signed).status_code == 401


def test_an_unlink_of_a_hostile_id_changes_nothing(world, gov_member):
    bob = gov_member()
    linked(world, bob, BOB)
    for identity in ("9" * 5000, "\u0663", "99999999999999999999", "-1"):
        assert console(bob).post("/t/acme/inbox/notifications/slack/unlink/",
                                 {"identity": identity}).status_code == 302
    assert SlackIdentity.objects.for_tenant(world.a.tenant).count() == 1


@pytest.mark.django_db(transaction=True)  # the ASGI handler runs the view in a thread with its own connection
def test_slack_has_its_answer_before_the_replies_go(world, gov_queue, gov_member, slack_channel, standin,
                                                     inbox_pending):
    """Slack gives an interaction three seconds: the 200 goes out first, the replies to response_url after it."""
    import asyncio

    from asgiref.sync import async_to_sync
    from django.core.handlers.asgi import ASGIHandler

    queue = gov_queue()
    channel = slack_channel(queue)
    linked(world, gov_member(), ALICE)
    [request] = inbox_pending(1, queue=queue)
    signed = standin.click(user=ALICE, action="approve", request_id=request.pk)
    replies_when_answered = []
    bodies = [{"type": "http.request", "body": signed.body, "more_body": False}]

    async def receive():
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()  # the client stays connected; the handler cancels this wait when it is done

    async def send(message):
        if message["type"] == "http.response.start":
            assert message["status"] == 200
        if message["type"] == "http.response.body" and not message.get("more_body"):
            replies_when_answered.append(len(standin.replies()))

    headers = [(b"host", b"testserver"), (b"content-type", b"application/x-www-form-urlencoded"),
               (b"content-length", str(len(signed.body)).encode()),
               *[(name.lower().encode(), value.encode()) for name, value in signed.headers.items()]]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": interaction_url(channel), "raw_path": interaction_url(channel).encode(), "query_string": b"",
             "headers": headers, "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}
    async_to_sync(ASGIHandler())(scope, receive, send)
    assert replies_when_answered == [0]  # answered with no reply posted yet
    assert status_of(request) == RequestStatus.APPROVED
    [reply] = standin.replies()  # posted once the answer was sent
    assert reply["replace_original"] is True and "Request approved" in reply["text"]
