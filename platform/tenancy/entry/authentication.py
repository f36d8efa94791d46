"""API authentication: tenant API keys (apps) and console sessions (operators)."""
from rest_framework import authentication, exceptions

from tenancy.models import Tenant
from tenancy.selectors import apikey_from_token, membership_of


class ApiKeyPrincipal:
    """The request.user of an API-key request: the key speaks for its tenant, not for a person."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, api_key):
        self.api_key = api_key
        self.username = f"apikey:{api_key.name}"

    def __str__(self):
        return self.username


MALFORMED_AUTHORIZATION = "Use 'Authorization: Bearer <api key>'."
INVALID_KEY = "Invalid or revoked API key."
# The HTTP entry may look a key up before it reads a request's body (toolkeeper.handlers): it leaves
# (token, ApiKey) in the request's ASGI scope under this name, so the key is not looked up twice.
CHECKED_KEY_SCOPE = "tenancy.checked_api_key"


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, or None."""
    keyword, _, token = header.partition(" ")
    if keyword.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        token = bearer_token(header)
        if token is None:
            raise exceptions.AuthenticationFailed(MALFORMED_AUTHORIZATION)
        checked_token, api_key = getattr(request, "scope", {}).get(CHECKED_KEY_SCOPE, (None, None))
        if checked_token != token:
            api_key = apikey_from_token(token)
        if api_key is None:
            raise exceptions.AuthenticationFailed(INVALID_KEY)
        api_key.touch()
        request.tenant = api_key.tenant
        request.membership = None
        return ApiKeyPrincipal(api_key), api_key

    def authenticate_header(self, request):
        return self.keyword


class ConsoleSessionAuthentication(authentication.SessionAuthentication):
    """A logged-in console user; the tenant comes from the X-Tenant header and needs a membership."""

    def authenticate(self, request):
        result = super().authenticate(request)
        if result is None:
            return None
        user, _ = result
        slug = request.META.get("HTTP_X_TENANT", "")
        tenant = Tenant.objects.filter(slug=slug).first() if slug else None
        membership = membership_of(user, tenant) if tenant else None
        if membership is None:
            raise exceptions.PermissionDenied("Name a tenant you belong to in the X-Tenant header.")
        request.tenant = tenant
        request.membership = membership
        return user, None
