"""Single sign-on, the person's side (docs/identity.md, "Single sign-on"): what the provider's verified claims
make of an account here, which memberships its role claim grants and takes away, and the sign-in pages when
passwords are off or the provider cannot be reached. The whole flow against a real provider, in a browser:
test_sso_browser.py."""
import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from audit.models import Event
from tenancy.models import Identity, Membership, Role
from tenancy.people import services as people
from tenancy.services import membership_set, tenant_create
from tenancy.signin.services import SignInRefused, claimed_roles, person_sign_in
from tests.live.server import free_port

pytestmark = pytest.mark.django_db

ISSUER = "https://id.example.com"
SSO = {"TOOLKEEPER_OIDC_ROLES_CLAIM": "groups", "TOOLKEEPER_OIDC_ROLE_PREFIX": "toolkeeper:",
       "TOOLKEEPER_OIDC_ALLOWED_DOMAINS": ["example.com"], "TOOLKEEPER_OIDC_TRUST_UNVERIFIED_EMAIL": False}
User = get_user_model()


def claims(sub="u-1", email="carol@example.com", verified=True, **more):
    return {"sub": sub, "email": email, "email_verified": verified, "name": "Carol Example", **more}


@pytest.fixture
def acme():
    founder = User.objects.create_user(username="sso-founder", password="x" * 12)
    return tenant_create(slug="sso-acme", name="Acme", admin=founder)


@pytest.fixture(autouse=True)
def sso_settings():
    with override_settings(**SSO):
        yield


def test_a_first_sign_in_makes_an_account_without_a_password_and_later_ones_find_it(acme):
    signed = person_sign_in(issuer=ISSUER, claims=claims())
    user = signed.user
    assert signed.created and user.username == "carol@example.com" and user.email == "carol@example.com"
    assert user.first_name == "Carol Example"
    assert not user.has_usable_password()  # nobody can sign in as them with a password
    assert Identity.objects.get(issuer=ISSUER, subject="u-1").user == user

    # the address changed at the provider: the same subject is the same person
    again = person_sign_in(issuer=ISSUER, claims=claims(email="carol.new@example.com"))
    assert not again.created and again.user.pk == user.pk
    user.refresh_from_db()
    assert user.email == "carol.new@example.com"
    # the same subject at another provider is someone else
    other = person_sign_in(issuer="https://other.example.com", claims=claims(email="c2@example.com"))
    assert other.created and other.user.pk != user.pk


def test_a_person_who_joined_with_a_password_keeps_their_account(acme):
    carol = User.objects.create_user(username="carol", password="x" * 12, email="Carol@Example.com")
    membership_set(tenant=acme, user=carol, role=Role.OPERATOR)
    signed = person_sign_in(issuer=ISSUER, claims=claims())
    assert signed.user.pk == carol.pk and not signed.created
    assert [m.role for m in signed.memberships] == [Role.OPERATOR]


def test_a_name_taken_by_another_account_gets_a_number(acme):
    User.objects.create_user(username="carol@example.com", password="x" * 12, email="")
    signed = person_sign_in(issuer=ISSUER, claims=claims())
    assert signed.user.username == "carol@example.com-2"


@pytest.mark.parametrize("bad, said", [
    (claims(email="dave@elsewhere.org"), "Accounts at elsewhere.org may not sign in"),
    (claims(verified=False), "has not verified carol@example.com"),
    (claims(email=""), "sent no email address"),
    (claims(email=["carol@example.com"]), "sent no email address"),
    (claims(sub=""), "sent no usable subject"),
    (claims(sub="x" * 300), "sent no usable subject"),
])
def test_people_the_deployment_does_not_let_in_are_refused_and_get_no_account(acme, bad, said):
    accounts = User.objects.count()
    with pytest.raises(SignInRefused) as refused:
        person_sign_in(issuer=ISSUER, claims=bad)
    assert said in refused.value.message
    assert not Identity.objects.exists()
    assert User.objects.count() == accounts


def test_an_unverified_address_is_taken_only_when_the_deployment_says_so(acme):
    unverified = claims()
    del unverified["email_verified"]
    with pytest.raises(SignInRefused):
        person_sign_in(issuer=ISSUER, claims=unverified)
    with override_settings(TOOLKEEPER_OIDC_TRUST_UNVERIFIED_EMAIL=True, TOOLKEEPER_OIDC_ALLOWED_DOMAINS=[]):
        assert person_sign_in(issuer=ISSUER, claims=unverified).created


def test_an_account_disabled_here_is_refused(acme):
    user = person_sign_in(issuer=ISSUER, claims=claims()).user
    user.is_active = False
    user.save()
    with pytest.raises(SignInRefused, match="disabled here"):
        person_sign_in(issuer=ISSUER, claims=claims())


def test_the_role_claim_grants_changes_and_takes_away_memberships(acme):
    beta = tenant_create(slug="sso-beta", name="Beta", admin=User.objects.get(username="sso-founder"))
    groups = ["toolkeeper:sso-acme:reviewer", "toolkeeper:sso-beta:viewer", "staff", "toolkeeper:nowhere:admin"]
    user = person_sign_in(issuer=ISSUER, claims=claims(groups=groups)).user
    held = {m.tenant.slug: (m.role, m.from_claim) for m in Membership.objects.filter(user=user)}
    assert held == {"sso-acme": (Role.REVIEWER, True), "sso-beta": (Role.VIEWER, True)}

    person_sign_in(issuer=ISSUER, claims=claims(groups=["toolkeeper:sso-acme:operator"]))
    held = {m.tenant.slug: m.role for m in Membership.objects.filter(user=user)}
    assert held == {"sso-acme": Role.OPERATOR}, "the claim no longer names beta: that membership ended"
    verbs = list(Event.objects.filter(tenant=beta).values_list("verb", flat=True))
    assert "membership.removed" in verbs

    person_sign_in(issuer=ISSUER, claims=claims(groups=[]))
    assert not Membership.objects.filter(user=user).exists()


def test_memberships_from_invitations_are_left_to_the_admins(acme):
    beta = tenant_create(slug="sso-beta", name="Beta", admin=User.objects.get(username="sso-founder"))
    link = people.invitation_create(tenant=beta, email="carol@example.com", role=Role.REVIEWER).link
    user = person_sign_in(issuer=ISSUER, claims=claims(groups=["toolkeeper:sso-acme:viewer"])).user
    people.invitation_accept(token=link.rstrip("/").rsplit("/", 1)[1], user=user)

    person_sign_in(issuer=ISSUER, claims=claims(groups=[]))
    held = {m.tenant.slug: (m.role, m.from_claim) for m in Membership.objects.filter(user=user)}
    assert held == {"sso-beta": (Role.REVIEWER, False)}


def test_a_claim_cannot_take_a_tenants_last_admin_away(acme):
    founder = User.objects.get(username="sso-founder")
    solo = tenant_create(slug="sso-solo", name="Solo", admin=founder)
    Membership.objects.filter(tenant=solo).delete()
    user = person_sign_in(issuer=ISSUER, claims=claims(groups=["toolkeeper:sso-solo:admin"])).user
    person_sign_in(issuer=ISSUER, claims=claims(groups=["toolkeeper:sso-solo:viewer"]))
    assert Membership.objects.get(user=user, tenant=solo).role == Role.ADMIN
    person_sign_in(issuer=ISSUER, claims=claims(groups=[]))
    assert Membership.objects.filter(user=user, tenant=solo).exists()


def test_claimed_roles_read_only_the_prefixed_values():
    assert claimed_roles({"groups": "toolkeeper:sso-acme:admin"}) == {"sso-acme": "admin"}
    assert claimed_roles({"groups": ["toolkeeper:sso-acme:viewer", "toolkeeper:sso-acme:operator",
                                     "toolkeeper:sso-acme:reviewer"]}) == {"sso-acme": "operator"}
    assert claimed_roles({"groups": ["toolkeeper:sso-acme:owner", "toolkeeper:acme", "acme:admin", 7]}) == {}
    assert claimed_roles({"groups": {"toolkeeper:sso-acme:admin": True}}) == {}
    assert claimed_roles({"roles": ["toolkeeper:sso-acme:admin"]}) == {}


def test_each_sign_in_is_in_the_audit_trail_of_the_persons_tenants(acme):
    person_sign_in(issuer=ISSUER, claims=claims(groups=["toolkeeper:sso-acme:viewer"]))
    event = Event.objects.filter(tenant=acme, verb="person.signed_in").get()
    assert event.target == "user:carol@example.com"
    assert event.data == {"method": "oidc", "issuer": ISSUER, "account_created": True}


# -- the pages ----------------------------------------------------------------------------------------------

def test_the_login_page_offers_what_the_deployment_allows():
    response = Client().get("/login/?next=/t/acme/")
    page = response.content.decode()
    assert 'id="id_password"' in page and 'id="sso"' not in page
    assert "form-action 'self';" in response["Content-Security-Policy"]
    with override_settings(TOOLKEEPER_OIDC_ISSUER=ISSUER + "/realms/acme", TOOLKEEPER_OIDC_CLIENT_ID="tk",
                           TOOLKEEPER_OIDC_NAME="Example <SSO>"):
        response = Client().get("/login/?next=/t/acme/")
        # signing out continues to the provider's end-session page: forms may go to its origin, no further
        assert f"form-action 'self' {ISSUER};" in response["Content-Security-Policy"]
        page = response.content.decode()
        assert 'href="/login/sso/?next=/t/acme/"' in page and "Sign in with Example &lt;SSO&gt;" in page
        assert 'id="id_password"' in page
        with override_settings(TOOLKEEPER_PASSWORD_LOGIN=False):
            page = Client().get("/login/").content.decode()
            assert 'id="sso"' in page and 'id="id_password"' not in page


def test_passwords_off_refuse_every_password_way_in(acme):
    User.objects.create_user(username="pat", password="a long enough passphrase 42")
    with override_settings(TOOLKEEPER_OIDC_ISSUER=ISSUER, TOOLKEEPER_OIDC_CLIENT_ID="tk",
                           TOOLKEEPER_PASSWORD_LOGIN=False):
        client = Client()
        refused = client.post("/login/", {"username": "pat", "password": "a long enough passphrase 42"})
        assert refused.status_code == 403 and "turned off" in refused.content.decode()
        assert "_auth_user_id" not in client.session
        # the admin site signs in on the same page
        assert client.get("/admin/login/?next=/admin/")["Location"] == "/login/?next=/admin/"
        # …and an invitation cannot make an account with a password
        link = people.invitation_create(tenant=acme, email="new@example.com", role=Role.VIEWER).link
        path = "/" + link.split("/", 3)[3]
        page = client.get(path).content.decode()
        assert 'id="create-account"' not in page and 'id="sso"' in page
        made = client.post(path, {"username": "newbie", "password": "a long enough passphrase 42"})
        assert made.status_code == 403
        assert not User.objects.filter(username="newbie").exists()
    # with passwords on, the same password works, and the sign-in is in the trail of the person's tenants
    membership_set(tenant=acme, user=User.objects.get(username="pat"), role=Role.VIEWER)
    assert Client().post("/login/", {"username": "pat", "password": "a long enough passphrase 42"}).status_code == 302
    assert Event.objects.get(tenant=acme, verb="person.signed_in").data == {"method": "password"}


def test_a_provider_that_cannot_be_reached_is_a_page_not_an_error():
    closed = f"http://127.0.0.1:{free_port()}"
    with override_settings(TOOLKEEPER_OIDC_ISSUER=closed, TOOLKEEPER_OIDC_CLIENT_ID="tk",
                           TOOLKEEPER_OIDC_TIMEOUT_S=2):
        response = Client().get("/login/sso/?next=/t/acme/")
        assert response.status_code == 503
        assert "could not be reached just now" in response.content.decode()


def test_single_sign_on_pages_without_a_provider_are_not_found():
    for path in ("/login/sso/", "/login/sso/callback/?code=x&state=y"):
        response = Client().get(path)
        assert response.status_code == 404 and "not set up" in response.content.decode()


def test_only_a_place_on_this_site_is_kept_to_return_to():
    from django.test import RequestFactory

    from tenancy.signin.pages import _safe_next
    request = RequestFactory().get("/login/sso/")
    for hostile in ("https://evil.example/", "//evil.example/x", "/\\evil.example", "javascript:alert(1)"):
        assert _safe_next(request, hostile) == ""
    assert _safe_next(request, "/t/acme/calls/?status=failed") == "/t/acme/calls/?status=failed"


# -- the provider's back-channel logout -----------------------------------------------------------------------

class _SignedBy:
    """The provider's side of a logout token: a key of its own, which the client reads as the provider's keys
    (the token checks themselves are the product's)."""

    def __init__(self):
        from joserfc.jwk import RSAKey
        self.key = RSAKey.generate_key(2048, parameters={"kid": "k1"})
        self.server_metadata = {"issuer": ISSUER, "id_token_signing_alg_values_supported": ["RS256"]}

    def fetch_jwk_set(self, force=False):
        from joserfc.jwk import KeySet
        return KeySet([self.key]).as_dict(private=False)

    def token(self, **claims) -> str:
        import time
        import uuid

        from joserfc import jwt
        body = {"iss": ISSUER, "aud": "tk", "iat": int(time.time()), "jti": uuid.uuid4().hex, "sub": "u-1",
                "events": {"http://schemas.openid.net/event/backchannel-logout": {}}, **claims}
        return jwt.encode({"alg": "RS256", "kid": "k1"}, {k: v for k, v in body.items() if v is not None}, self.key)


@pytest.fixture
def signed_by(monkeypatch):
    from tenancy.signin import provider as provider_module
    signer = _SignedBy()
    monkeypatch.setattr(provider_module, "provider", lambda: signer)
    with override_settings(TOOLKEEPER_OIDC_ISSUER=ISSUER, TOOLKEEPER_OIDC_CLIENT_ID="tk"):
        yield signer


@pytest.mark.parametrize("claims, said", [
    ({"iss": "https://evil.example.com"}, "another issuer"),
    ({"aud": "someone-else"}, "another audience"),
    ({"iat": 1_000_000_000}, "too old"),
    ({"events": {"something-else": {}}}, "not a logout event"),
    ({"nonce": "n"}, "a nonce"),
    ({"sub": None}, "no sub or sid"),
    ({"jti": None}, "no jti"),
])
def test_a_logout_token_must_be_the_providers_for_us_and_fresh(signed_by, claims, said):
    from tenancy.signin.provider import LogoutTokenRefused, logout_token_claims
    with pytest.raises(LogoutTokenRefused, match=said):
        logout_token_claims(signed_by.token(**claims))


def test_a_logout_token_works_once_and_ends_the_persons_sessions_and_grants(signed_by, acme):
    from django.contrib.sessions.backends.db import SessionStore

    from tenancy.signin.provider import LogoutTokenRefused, logout_token_claims
    from tenancy.signin.services import provider_session_note, provider_sign_out
    signed = person_sign_in(issuer=ISSUER, claims=claims(groups=["toolkeeper:sso-acme:operator"]))
    session = SessionStore()
    session["x"] = 1
    session.create()
    provider_session_note(identity=signed.identity, sid="sid-1", session_key=session.session_key)
    token = signed_by.token()
    verified = logout_token_claims(token)
    with pytest.raises(LogoutTokenRefused, match="used already"):
        logout_token_claims(token)
    assert provider_sign_out(issuer=ISSUER, subject=verified["sub"]) == 1
    assert not SessionStore().exists(session.session_key)
    assert Event.objects.filter(tenant=acme, verb="person.signed_out").count() == 1
    # a token that names the session alone finds the person by it
    again = SessionStore()
    again.create()
    provider_session_note(identity=signed.identity, sid="sid-2", session_key=again.session_key)
    assert provider_sign_out(issuer=ISSUER, sid="sid-2") == 1
    assert not SessionStore().exists(again.session_key)


# -- an app's end user, verified by their ID token ----------------------------------------------------------

def _new_session(world, **body):
    from rest_framework.test import APIClient
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.a.keys['agent']}")
    return client.post("/api/v1/sessions", {"agent": "support-bot", **body}, format="json")


def test_an_apps_end_user_is_verified_by_their_id_token(world, signed_by):
    import time
    token = signed_by.token(email="dana@example.com", email_verified=True, exp=int(time.time()) + 300)
    made = _new_session(world, user_id_token=token)
    assert made.status_code == 201, made.content
    assert (made.json()["user"], made.json()["user_verified"]) == ("dana@example.com", True)
    assert "user_id_token" not in made.json()
    # naming the same person is fine; naming someone else is not
    assert _new_session(world, user="Dana@Example.com", user_id_token=token).status_code == 201
    other = _new_session(world, user="eve@example.com", user_id_token=token)
    assert other.status_code == 400 and "someone else" in str(other.json())
    # a user only named by the app stays asserted
    asserted = _new_session(world, user="dana@example.com")
    assert asserted.json()["user_verified"] is False


@pytest.mark.parametrize("claims, said", [
    ({"aud": "another-app"}, "an audience this deployment does not trust"),
    ({"exp": 1_000_000_000}, "expired"),
    ({"email_verified": False}, "has not verified"),
    ({"iss": "https://evil.example.com"}, "another issuer"),
])
def test_an_id_token_that_does_not_hold_is_refused(world, signed_by, claims, said):
    import time
    token = signed_by.token(**{"email": "dana@example.com", "email_verified": True, "exp": int(time.time()) + 300,
                               **claims})
    refused = _new_session(world, user_id_token=token)
    assert refused.status_code == 400
    assert said in str(refused.json()["error"]["fields"]["user_id_token"])


def test_an_id_token_needs_an_identity_provider_and_a_signature(world):
    refused = _new_session(world, user_id_token="eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.")
    assert refused.status_code == 400 and "no identity provider" in str(refused.json())
