"""An external authorization server's access tokens (docs/identity.md, "An external authorization server"): which
are good on `/mcp/`, and for whom. The server's side is a key made here that the server reads as the company
server's keys; the checks are the product's. The whole flow with a real server: test_external_server.py."""
import time

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings

from tenancy.models import Identity, OAuthGrant, Role
from tenancy.oauth import external
from tenancy.oauth.external import ExternalTokenRefused, apikey_from_external_token
from tenancy.selectors import mcp_resource
from tenancy.services import grant_revoke, membership_remove, membership_set, tenant_create

pytestmark = pytest.mark.django_db

ISSUER = "https://auth.example.com"


class _Keys:
    def __init__(self):
        from joserfc.jwk import RSAKey
        self.key = RSAKey.generate_key(2048, parameters={"kid": "as-1"})

    def keys(self, *, fresh=False):
        from joserfc.jwk import KeySet
        return KeySet.import_key_set(KeySet([self.key]).as_dict(private=False))

    def token(self, **claims) -> str:
        from joserfc import jwt
        body = {"iss": ISSUER, "aud": mcp_resource(), "sub": "ext-1", "scope": "openid agent",
                "exp": int(time.time()) + 300, "iat": int(time.time()), "azp": "company-ide", **claims}
        return jwt.encode({"alg": "RS256", "kid": "as-1"}, {k: v for k, v in body.items() if v is not None}, self.key)


@pytest.fixture
def company(monkeypatch):
    keys = _Keys()
    monkeypatch.setattr(external, "server_keys", keys)
    user = get_user_model().objects.create_user(username="ext-person", email="ext@example.com")
    tenant = tenant_create(slug="ext-one", name="Ext", admin=get_user_model().objects.create_user(username="ext-a"))
    membership_set(tenant=tenant, user=user, role=Role.OPERATOR)
    Identity.objects.create(user=user, issuer=ISSUER, subject="ext-1", email="ext@example.com")
    with override_settings(TOOLKEEPER_MCP_OAUTH="external", TOOLKEEPER_MCP_OAUTH_ISSUER=ISSUER):
        yield keys, user, tenant


def test_a_good_token_acts_for_its_person_under_one_grant(company):
    keys, user, tenant = company
    key = apikey_from_external_token(keys.token(), tenant_slug="ext-one", agent="ide")
    assert (key.acting_for, key.tenant, key.agent, key.scopes) == (user, tenant, "ide", ["agent"])
    again = apikey_from_external_token(keys.token(), tenant_slug="ext-one", agent="ide")
    assert again.pk == key.pk and OAuthGrant.all_tenants.count() == 1


@pytest.mark.parametrize("claims, said", [
    ({"aud": "https://elsewhere.example.com/api"}, "another audience"),
    ({"iss": "https://evil.example.com"}, "another issuer"),
    ({"exp": int(time.time()) - 5}, "expired"),
    ({"scope": "openid"}, "no agent scope"),
    ({"sub": "someone-unknown"}, "does not know this person"),
])
def test_a_token_that_is_not_good_here_is_refused(company, claims, said):
    keys, _, _ = company
    with pytest.raises(ExternalTokenRefused, match=said):
        apikey_from_external_token(keys.token(**claims), tenant_slug="ext-one", agent="ide")


def test_the_person_must_be_a_member_who_may_connect_an_agent(company):
    keys, user, tenant = company
    with pytest.raises(ExternalTokenRefused, match="name a tenant"):
        apikey_from_external_token(keys.token(), tenant_slug="", agent="ide")
    with pytest.raises(ExternalTokenRefused, match="reserved"):
        apikey_from_external_token(keys.token(), tenant_slug="ext-one", agent="toolkeeper")
    membership_set(tenant=tenant, user=user, role=Role.VIEWER)
    with pytest.raises(ExternalTokenRefused, match="name a tenant"):
        apikey_from_external_token(keys.token(), tenant_slug="ext-one", agent="ide")


def test_a_disconnected_client_needs_a_new_token_and_a_leaver_none_works(company):
    keys, user, tenant = company
    old = keys.token(iat=int(time.time()) - 10)
    apikey_from_external_token(old, tenant_slug="ext-one", agent="ide")
    grant_revoke(grant=OAuthGrant.all_tenants.get(), actor=user)
    with pytest.raises(ExternalTokenRefused, match="disconnected"):
        apikey_from_external_token(old, tenant_slug="ext-one", agent="ide")
    newer = keys.token(iat=int(time.time()) + 1)
    assert apikey_from_external_token(newer, tenant_slug="ext-one", agent="ide").revoked_at is None
    membership_remove(tenant=tenant, user=user)
    with pytest.raises(ExternalTokenRefused):
        apikey_from_external_token(keys.token(iat=int(time.time()) + 2), tenant_slug="ext-one", agent="ide")
