"""Members, invitations and profiles (docs/notes/console.md, "People"): an invitation's link is signed, expires,
works once and is kept only as a hash; roles change and members leave from the console, audited; a tenant
keeps an admin; each person's time zone shows on their pages."""
import re
import socket
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from django.core import mail, signing
from django.core.cache import cache
from django.test import Client, override_settings
from django.utils import timezone

from audit.models import Event
from tenancy.entry import limits
from tenancy.models import Invitation, Membership, Profile, Role, hash_secret
from tenancy.people import services
from tenancy.services import membership_remove, membership_set, tenant_limits_set

pytestmark = pytest.mark.django_db

LINK_RE = re.compile(r'<div class="secret" id="invitation-link">(http[^<]+)</div>')
NEW_PASSWORD = "a long enough passphrase 42"


def invite(client, email="new.person@example.com", role="reviewer", slug="acme"):
    response = client.post(f"/t/{slug}/members/", {"email": email, "role": role})
    assert response.status_code == 302, response.content.decode()[:3000]
    page = client.get(response["Location"])
    match = LINK_RE.search(page.content.decode())
    assert match, "the link is shown once after inviting"
    return match.group(1).replace("&amp;", "&"), page


def path_of(link: str) -> str:
    return "/" + link.split("/", 3)[3]


def verbs(tenant) -> list[str]:
    return list(Event.objects.for_tenant(tenant).order_by("pk").values_list("verb", flat=True))


def test_an_invitation_is_mailed_shown_once_and_kept_only_as_a_hash(world):
    admin = world.a.console("admin")
    link, page = invite(admin)
    assert "It was emailed to new.person@example.com" in page.content.decode()
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["new.person@example.com"]
    assert link in mail.outbox[0].body and world.a.tenant.name in mail.outbox[0].subject
    invitation = Invitation.objects.for_tenant(world.a.tenant).get(email="new.person@example.com")
    _, secret = signing.loads(path_of(link).rstrip("/").rsplit("/", 1)[1], salt=services.INVITATION_SALT)
    assert invitation.secret_hash == hash_secret(secret) and invitation.role == Role.REVIEWER
    assert not any(secret in str(getattr(invitation, f.attname)) for f in Invitation._meta.concrete_fields)
    again = admin.get(f"/t/acme/members/invitations/{invitation.pk}/").content.decode()
    assert secret not in again and "cannot be shown again" in again
    assert not any(secret in str(value) for value in admin.session.values())
    assert not any(secret in str(e.data) for e in Event.objects.for_tenant(world.a.tenant))
    assert "invitation.created" in verbs(world.a.tenant)
    members_page = admin.get("/t/acme/members/").content.decode()
    assert "new.person@example.com" in members_page and secret not in members_page


@override_settings(EMAIL_BACKEND="django.core.mail.backends.console.EmailBackend")
def test_without_a_mail_server_the_link_is_given_to_pass_on(world, capsys):
    admin = world.a.console("admin")
    assert "No mail server is configured" in admin.get("/t/acme/members/").content.decode()
    link, page = invite(admin)
    assert "No mail server is configured: nothing was emailed" in page.content.decode()
    assert link not in capsys.readouterr().out  # not even printed where nobody reads it


def test_a_new_person_creates_an_account_and_joins_once(world):
    link, _ = invite(world.a.console("admin"), role="operator")
    visitor = Client()
    page = visitor.get(path_of(link)).content.decode()
    assert "Join" in page and "as <strong>operator</strong>" in page and 'id="create-account"' in page
    joined = visitor.post(path_of(link), {"username": "newbie", "password": NEW_PASSWORD})
    assert joined.status_code == 302 and joined["Location"] == "/t/acme/"
    user = get_user_model().objects.get(username="newbie")
    assert user.email == "new.person@example.com" and user.check_password(NEW_PASSWORD)
    assert Membership.objects.for_tenant(world.a.tenant).get(user=user).role == Role.OPERATOR
    assert visitor.get("/t/acme/tools/").status_code == 200  # signed in
    assert verbs(world.a.tenant)[-2:] == ["membership.set", "invitation.accepted"]
    # once: neither the same visitor nor anyone else gets in with it again
    for client in (visitor, Client()):
        refused = client.get(path_of(link))
        assert refused.status_code == 404 and services.LINK_REFUSED in refused.content.decode()
        assert client.post(path_of(link), {"username": "second", "password": NEW_PASSWORD}).status_code == 404
    assert not get_user_model().objects.filter(username="second").exists()


def test_a_signed_in_person_joins_with_one_button(world):
    link, _ = invite(world.a.console("admin"), email="bea@initech.example", role="viewer")
    other = world.b.console("viewer")  # a member of the other tenant only
    assert 'id="accept"' in other.get(path_of(link)).content.decode()
    assert other.post(path_of(link)).status_code == 302
    assert Membership.objects.for_tenant(world.a.tenant).get(user=world.b.users["viewer"]).role == Role.VIEWER


def test_a_refused_account_leaves_nothing_behind_and_the_link_still_works(world):
    link, _ = invite(world.a.console("admin"))
    visitor = Client()
    weak = visitor.post(path_of(link), {"username": "newbie", "password": "123"})
    taken = visitor.post(path_of(link), {"username": world.a.users["admin"].username, "password": NEW_PASSWORD})
    assert weak.status_code == taken.status_code == 400
    assert "This password is too short" in weak.content.decode()
    assert "this user name is taken" in taken.content.decode()
    assert not get_user_model().objects.filter(username="newbie").exists()
    assert visitor.post(path_of(link), {"username": "newbie", "password": NEW_PASSWORD}).status_code == 302


def test_a_changed_expired_revoked_or_replaced_link_is_refused(world):
    admin = world.a.console("admin")
    link, _ = invite(admin)
    token = path_of(link).rstrip("/").rsplit("/", 1)[1]
    invitation_id, secret = signing.loads(token, salt=services.INVITATION_SALT)
    forged = signing.dumps([invitation_id, secret + "x"], salt=services.INVITATION_SALT)
    unsigned = token[:-3] + ("aaa" if not token.endswith("aaa") else "bbb")
    assert services.invitation_from_link(token) is not None
    for bad in (forged, unsigned, "nonsense", signing.dumps(["1", secret], salt=services.INVITATION_SALT)):
        assert Client().get(f"/account/invitations/{bad}/").status_code == 404
    # replaced: inviting the address again revokes the first link
    second, _ = invite(admin)
    assert services.invitation_from_link(token) is None and services.invitation_from_link(
        path_of(second).rstrip("/").rsplit("/", 1)[1]) is not None
    # expired
    Invitation.objects.for_tenant(world.a.tenant).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert Client().get(path_of(second)).status_code == 404
    # revoked from the members page
    third, _ = invite(admin, email="third@example.com")
    pending = Invitation.objects.for_tenant(world.a.tenant).get(email="third@example.com", revoked_at=None)
    assert admin.post(f"/t/acme/members/invitations/{pending.pk}/revoke/").status_code == 302
    assert Client().get(path_of(third)).status_code == 404
    assert "invitation.revoked" in verbs(world.a.tenant)


def test_two_people_following_one_link_join_once(world):
    issued = services.invitation_create(tenant=world.a.tenant, email="x@example.com", role="viewer")
    token = issued.link.rstrip("/").rsplit("/", 1)[1]
    first, second = world.b.users["viewer"], world.b.users["operator"]
    services.invitation_accept(token=token, user=first)
    with pytest.raises(services.ServiceError, match="not valid"):
        services.invitation_accept(token=token, user=second)
    assert not Membership.objects.for_tenant(world.a.tenant).filter(user=second).exists()


def test_inviting_checks_the_address_the_role_and_existing_members(world):
    admin = world.a.console("admin")
    existing = world.a.users["viewer"]
    existing.email = "viewer@acme.example"
    existing.save()
    for data, message in (({"email": "not an address", "role": "viewer"}, "Enter a valid email address"),
                          ({"email": "a@example.com", "role": "owner"}, "Select a valid choice"),
                          ({"email": "VIEWER@acme.example", "role": "viewer"}, "is already a member")):
        response = admin.post("/t/acme/members/", data)
        assert response.status_code == 400 and message in response.content.decode()
    assert not Invitation.objects.for_tenant(world.a.tenant).exists()


def test_only_admins_see_and_change_members(world):
    for role in ("operator", "reviewer", "viewer"):
        client = world.a.console(role)
        assert client.get("/t/acme/members/").status_code == 403
        assert client.post("/t/acme/members/", {"email": "a@example.com", "role": "admin"}).status_code == 403
    assert not Invitation.objects.for_tenant(world.a.tenant).exists()
    assert 'href="/t/acme/members/"' in world.a.console("admin").get("/t/acme/").content.decode()
    assert 'href="/t/acme/members/"' not in world.a.console("operator").get("/t/acme/").content.decode()


def test_an_admin_changes_a_role_and_a_tenant_keeps_an_admin(world):
    admin = world.a.console("admin")
    reviewer = Membership.objects.for_tenant(world.a.tenant).get(user=world.a.users["reviewer"])
    assert admin.post(f"/t/acme/members/{reviewer.pk}/role/", {f"m{reviewer.pk}-role": "operator"}).status_code == 302
    reviewer.refresh_from_db()
    assert reviewer.role == Role.OPERATOR and verbs(world.a.tenant)[-1] == "membership.set"
    me = Membership.objects.for_tenant(world.a.tenant).get(user=world.a.users["admin"])
    assert list(Membership.objects.for_tenant(world.a.tenant).filter(role=Role.ADMIN)) == [me]
    demoted = admin.post(f"/t/acme/members/{me.pk}/role/", {f"m{me.pk}-role": "viewer"}, follow=True)
    assert "keeps at least one admin" in demoted.content.decode()
    me.refresh_from_db()
    assert me.role == Role.ADMIN
    leave = admin.post(f"/t/acme/members/{me.pk}/remove/")
    assert leave.status_code == 400 and "keeps at least one admin" in leave.content.decode()
    assert Membership.objects.for_tenant(world.a.tenant).filter(pk=me.pk).exists()
    # with a second admin, the first may go
    membership_set(tenant=world.a.tenant, user=world.a.users["operator"], role=Role.ADMIN)
    assert admin.post(f"/t/acme/members/{me.pk}/remove/")["Location"] == "/"
    assert admin.get("/t/acme/").status_code == 404


def test_removing_a_member_says_what_it_ends_and_is_audited(world):
    admin = world.a.console("admin")
    reviewer = Membership.objects.for_tenant(world.a.tenant).get(user=world.a.users["reviewer"])
    page = admin.get(f"/t/acme/members/{reviewer.pk}/remove/").content.decode()
    assert "lose access" in page and "live streams and waiting requests end" in page
    assert admin.post(f"/t/acme/members/{reviewer.pk}/remove/").status_code == 302
    assert not Membership.objects.for_tenant(world.a.tenant).filter(pk=reviewer.pk).exists()
    assert verbs(world.a.tenant)[-1] == "membership.removed"
    assert world.a.console("reviewer").get("/t/acme/inbox/").status_code == 404


def test_the_last_admin_is_kept_by_the_services_too(world):
    with pytest.raises(services.ServiceError, match="at least one admin"):
        membership_remove(tenant=world.a.tenant, user=world.a.users["admin"])
    with pytest.raises(services.ServiceError, match="at least one admin"):
        membership_set(tenant=world.a.tenant, user=world.a.users["admin"], role=Role.OPERATOR)


def test_a_profile_keeps_name_email_and_time_zone_and_pages_use_the_zone(world):
    client = world.a.console("admin")
    page = client.get("/account/profile/").content.decode()
    assert "Europe/Berlin" in page and 'href="/t/acme/inbox/notifications/"' in page
    bad = client.post("/account/profile/", {"name": "Ada", "email": "nope", "time_zone": "Mars/Olympus"})
    assert bad.status_code == 400 and "Enter a valid email address" in bad.content.decode()
    assert "Select a valid choice" in bad.content.decode()
    assert 'value="Ada"' in bad.content.decode()  # what was typed stays
    saved = client.post("/account/profile/", {"name": "Ada Admin", "email": "ada@acme.example",
                                              "time_zone": "Asia/Tokyo"})
    assert saved.status_code == 302
    user = world.a.users["admin"]
    user.refresh_from_db()
    assert user.email == "ada@acme.example"
    assert Profile.objects.get(user=user).time_zone == "Asia/Tokyo"
    members = client.get("/t/acme/members/").content.decode()
    assert "Ada Admin" in members and " JST</time>" in members


def test_services_refuse_an_unknown_time_zone_and_a_long_name(world):
    with pytest.raises(services.ServiceError) as refused:
        services.profile_update(user=world.a.users["admin"], name="x" * 151, email="", time_zone="Nowhere/City")
    assert set(refused.value.fields) == {"name", "time_zone"}


def test_pending_invitations_are_capped(world):
    Invitation.objects.bulk_create([
        Invitation(tenant=world.a.tenant, email=f"p{i}@example.com", role="viewer", secret_hash="x",
                   expires_at=timezone.now() + timedelta(days=1)) for i in range(services.PENDING_INVITATIONS_MAX)])
    with pytest.raises(services.ServiceError, match="invitations are open already"):
        services.invitation_create(tenant=world.a.tenant, email="one.more@example.com", role="viewer")


def test_accepting_counts_against_the_tenants_rate_limit(world, monkeypatch):
    """An invitation's page changes the tenant: its limits count it as they count every console change."""
    monkeypatch.setattr(limits, "time", SimpleNamespace(time=lambda: 1_800_000_000 - 1_800_000_000 % 60 + 15))
    first, _ = invite(world.a.console("admin"), email="one@initech.example", role="viewer")
    second, _ = invite(world.a.console("admin"), email="two@initech.example", role="viewer")
    tenant_limits_set(tenant=world.a.tenant, key_requests_per_minute=0, tenant_requests_per_minute=1)
    cache.clear()  # the inviting pages counted too: the minute starts afresh
    assert world.b.console("viewer").post(path_of(first)).status_code == 302
    refused = world.b.console("admin").post(path_of(second))
    assert refused.status_code == 429 and refused["Retry-After"] == "45"
    assert not Membership.objects.for_tenant(world.a.tenant).filter(user=world.b.users["admin"]).exists()


def test_a_mail_server_that_refuses_leaves_the_invitation_and_its_link_to_pass_on(world, caplog):
    """A real SMTP backend aimed at a port where nothing listens: the invitation is made, the page says it was
    not mailed and shows the link, and the log names no link."""
    with socket.socket() as probe:  # a port that was free a moment ago: connecting to it is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with override_settings(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1",
                           EMAIL_PORT=port, EMAIL_TIMEOUT=5):
        link, page = invite(world.a.console("admin"), email="late@example.com")
    assert 'id="not-mailed"' in page.content.decode()
    assert Invitation.objects.for_tenant(world.a.tenant).get(email="late@example.com").state == "pending"
    assert "could not be mailed" in caplog.text and path_of(link) not in caplog.text
