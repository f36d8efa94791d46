"""An MCP client a member connected with OAuth, made through the authorization server's own services (the
consent and the code exchange), for tests that need one in the world: tests/identity/test_mcp_oauth.py drives the
same steps over HTTP."""
from tenancy.models import OAuthGrant
from tenancy.oauth import services
from tenancy.selectors import mcp_resource

REDIRECT = "http://127.0.0.1:9/cb"


def connected_client(*, tenant, user, agent: str, client_id: str, name: str = "IDE") -> OAuthGrant:
    return client_connect(tenant=tenant, user=user, agent=agent, client_id=client_id, name=name)[0]


def client_connect(*, tenant, user, agent: str, client_id: str, name: str = "IDE"):
    """(the grant, the client's first access token)."""
    client = services.client_get(client_id) or services.client_register(
        metadata={"client_id": client_id, "client_name": name, "redirect_uris": [REDIRECT]}, client_secret=None)
    consent = services.Consent(client_id=client.client_id, redirect_uri=REDIRECT, redirect_uri_provided_explicitly=True,
                               code_challenge="c" * 43, scopes=("agent",), state=None, resource=mcp_resource())
    code = services.code_issue(consent=consent, user=user, tenant=tenant, agent=agent, scopes=["agent"])
    tokens = services.code_exchange(code=services.code_load(client_id=client.client_id, code=code))
    grant = OAuthGrant.objects.for_tenant(tenant).get(client=client, api_key__agent=agent, revoked_at__isnull=True)
    return grant, tokens.access_token
